package dlqwriters;

import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.LogAndContinueExceptionHandler;
import org.apache.kafka.streams.errors.LogAndContinueProcessingExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.PunctuationType;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;

/**
 * A small Kafka Streams application with a dead-letter queue (KIP-1034), for the DLQ tool's tests.
 *
 * <p>Reads INPUT with a byte-array key and an Integer value, passes non-negative values to OUTPUT. Three
 * failures reach the DLQ through Kafka's own handlers: a value that is not 4 bytes fails to deserialize
 * (LogAndContinueExceptionHandler), a negative value fails in the processor
 * (LogAndContinueProcessingExceptionHandler), and a value of 0 arms the wall-clock punctuator, which then
 * fails once: a record with no input record behind it.
 *
 * <p>Usage: StreamsDlqApp BOOTSTRAP APPLICATION_ID INPUT OUTPUT DLQ STATE_DIR. Prints "STREAMS RUNNING" once
 * it runs; stops cleanly on SIGTERM.
 */
public final class StreamsDlqApp {
    private StreamsDlqApp() { }

    static final class Checker implements Processor<byte[], Integer, byte[], Integer> {
        private ProcessorContext<byte[], Integer> context;
        private boolean armed;

        @Override
        public void init(final ProcessorContext<byte[], Integer> context) {
            this.context = context;
            context.schedule(Duration.ofMillis(200), PunctuationType.WALL_CLOCK_TIME, now -> {
                if (armed) {
                    armed = false;
                    throw new IllegalStateException("punctuator failed on purpose");
                }
            });
        }

        @Override
        public void process(final Record<byte[], Integer> record) {
            final Integer value = record.value();
            if (value != null && value < 0) {
                throw new IllegalArgumentException("negative value " + value);
            }
            if (value != null && value == 0) {
                armed = true;
            }
            context.forward(record);
        }
    }

    public static void main(final String[] args) throws Exception {
        final Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[5]);
        props.put(StreamsConfig.ERRORS_DEAD_LETTER_QUEUE_TOPIC_NAME_CONFIG, args[4]);
        props.put(StreamsConfig.DESERIALIZATION_EXCEPTION_HANDLER_CLASS_CONFIG,
            LogAndContinueExceptionHandler.class);
        props.put(StreamsConfig.PROCESSING_EXCEPTION_HANDLER_CLASS_CONFIG,
            LogAndContinueProcessingExceptionHandler.class);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");

        final StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args[2], Consumed.with(Serdes.ByteArray(), Serdes.Integer()))
            .process(Checker::new)
            .to(args[3], Produced.with(Serdes.ByteArray(), Serdes.Integer()));

        final KafkaStreams streams = new KafkaStreams(builder.build(), props);
        final CountDownLatch stopped = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING) {
                System.out.println("STREAMS RUNNING");
                System.out.flush();
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(20));
            stopped.countDown();
        }));
        streams.start();
        stopped.await();
    }
}

package dlqwriters;

import java.nio.charset.StandardCharsets;
import java.util.Collection;
import java.util.Map;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.consumer.Consumer;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.springframework.kafka.core.DefaultKafkaConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaProducerFactory;
import org.springframework.kafka.core.KafkaTemplate;
import org.springframework.kafka.listener.ConsumerAwareRebalanceListener;
import org.springframework.kafka.listener.ContainerProperties;
import org.springframework.kafka.listener.DeadLetterPublishingRecoverer;
import org.springframework.kafka.listener.DefaultErrorHandler;
import org.springframework.kafka.listener.KafkaMessageListenerContainer;
import org.springframework.kafka.listener.MessageListener;
import org.springframework.util.backoff.FixedBackOff;

/**
 * A small Spring for Apache Kafka consumer whose failures go to a dead-letter topic through Spring's own
 * DeadLetterPublishingRecoverer (its default destination: TOPIC-dlt, same partition), for the DLQ tool's
 * tests.
 *
 * <p>The listener parses each value as "n:INTEGER"; any other value fails with an IllegalArgumentException
 * caused by Java's NumberFormatException, which the DefaultErrorHandler hands to the recoverer at once (no
 * retries). Usage: SpringDlqApp BOOTSTRAP GROUP TOPIC. Prints "SPRING RUNNING" once it has partitions;
 * stops cleanly on SIGTERM.
 */
public final class SpringDlqApp {
    private SpringDlqApp() { }

    public static void main(final String[] args) throws Exception {
        final Map<String, Object> producerProps = Map.of(
            ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0],
            ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class,
            ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
        final KafkaTemplate<byte[], byte[]> template =
            new KafkaTemplate<>(new DefaultKafkaProducerFactory<>(producerProps));

        final Map<String, Object> consumerProps = Map.of(
            ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0],
            ConsumerConfig.GROUP_ID_CONFIG, args[1],
            ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest",
            ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class,
            ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);

        final ContainerProperties container = new ContainerProperties(args[2]);
        container.setMessageListener((MessageListener<byte[], byte[]>) (ConsumerRecord<byte[], byte[]> record) -> {
            final String text = record.value() == null ? "" : new String(record.value(), StandardCharsets.UTF_8);
            try {
                Integer.parseInt(text.startsWith("n:") ? text.substring(2) : text);
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException("not n:INTEGER", e);
            }
        });
        container.setConsumerRebalanceListener(new ConsumerAwareRebalanceListener() {
            @Override
            public void onPartitionsAssigned(final Consumer<?, ?> consumer, final Collection<TopicPartition> partitions) {
                if (!partitions.isEmpty()) {
                    System.out.println("SPRING RUNNING");
                    System.out.flush();
                }
            }
        });

        final KafkaMessageListenerContainer<byte[], byte[]> listener = new KafkaMessageListenerContainer<>(
            new DefaultKafkaConsumerFactory<>(consumerProps), container);
        listener.setCommonErrorHandler(
            new DefaultErrorHandler(new DeadLetterPublishingRecoverer(template), new FixedBackOff(0L, 0L)));

        final CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            listener.stop();
            stopped.countDown();
        }));
        listener.start();
        stopped.await();
    }
}

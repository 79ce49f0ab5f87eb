import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.Collection;
import java.util.HashMap;
import java.util.Map;
import java.util.TreeSet;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.springframework.context.annotation.AnnotationConfigApplicationContext;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.context.annotation.Import;
import org.springframework.kafka.annotation.EnableKafka;
import org.springframework.kafka.annotation.KafkaListener;
import org.springframework.kafka.config.ConcurrentKafkaListenerContainerFactory;
import org.springframework.kafka.config.KafkaListenerEndpointRegistry;
import org.springframework.kafka.core.ConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaProducerFactory;
import org.springframework.kafka.core.KafkaTemplate;
import org.springframework.kafka.listener.MessageListenerContainer;
import org.springframework.kafka.retrytopic.RetryTopicConfiguration;
import org.springframework.kafka.retrytopic.RetryTopicConfigurationBuilder;
import org.springframework.kafka.retrytopic.RetryTopicConfigurationSupport;
import org.springframework.kafka.support.KafkaHeaders;
import org.springframework.scheduling.TaskScheduler;
import org.springframework.scheduling.concurrent.ThreadPoolTaskScheduler;

/**
 * The Spring side of `python -m bench --scenarios spring-vs-tiers` (bench/vs_spring.py): a plain Spring
 * context (no Spring Boot) whose one @KafkaListener gets Spring Kafka's non-blocking retries from a
 * RetryTopicConfiguration bean: a fixed back-off of 2 s, 2 attempts (the first delivery and one from the
 * retry topic), then the DLT. The listener does what the bench app does for the sidecar in tier mode: it
 * accepts every record at once, except 10 % of the source offsets (the same function of partition and
 * offset as bench/benchapp.py) which it fails on their first sighting and accepts from the retry topic.
 *
 * <p>System properties: bench.bootstrap, bench.topic, bench.group, bench.retrySuffix, bench.dltSuffix, and
 * bench.consumer.KEY for any consumer setting, bench.verifyPartition and bench.failPercent (experiments
 * only).
 * The retry and dead-letter topics are created by the bench (message.timestamp.type=LogAppendTime, so a
 * retry record's timestamp is the time the broker wrote it), not by Spring. Protocol on stdin, one answer
 * line on stdout each: "stats" (JSON counters), "dump" (JSON: each source record's sightings, accepts
 * and the wall-clock time in microseconds its retry was received, 0 for none), "topics" (the
 * topics the listener containers are assigned); end of input stops the context and exits.
 */
public final class RetryTopicsBench {
    // -Dbench.failPercent=N: another share failed once (an experiment; the figures use 10)
    static final int TIER_PERCENT = Integer.getInteger("bench.failPercent", 10);

    /** What the listener saw; one lock, held for a few field updates per record. */
    static final class Seen {
        long records;
        long clean;
        long released;
        long retriedAccepted;
        long firstNanos;
        long cleanLastNanos;
        long lastNanos;
        // (partition << 40 | offset) -> {sightings, accepts}; and the retry's receive time
        final Map<Long, int[]> counts = new HashMap<>();
        final Map<Long, Long> retryReceivedMicros = new HashMap<>();
    }

    static final Seen SEEN = new Seen();

    static boolean failsOnce(final int partition, final long offset) {
        return (offset * 7919 + partition * 104729L) % 100 < TIER_PERCENT;
    }

    static long headerLong(final ConsumerRecord<?, ?> record, final String name, final boolean asInt) {
        final Header header = record.headers().lastHeader(name);
        if (header == null) {
            throw new IllegalStateException("no " + name + " header on a retry record");
        }
        final ByteBuffer buf = ByteBuffer.wrap(header.value());
        return asInt ? buf.getInt() : buf.getLong();
    }

    /** The listener bean. */
    public static final class Listener {
        private final String mainTopic = System.getProperty("bench.topic");

        @KafkaListener(id = "bench", topics = "${bench.topic}", groupId = "${bench.group}")
        public void listen(final ConsumerRecord<byte[], byte[]> record) {
            final long now = System.nanoTime();
            final boolean fromRetry = !record.topic().equals(mainTopic);
            final int partition = fromRetry
                ? (int) headerLong(record, KafkaHeaders.ORIGINAL_PARTITION, true) : record.partition();
            final long offset = fromRetry
                ? headerLong(record, KafkaHeaders.ORIGINAL_OFFSET, false) : record.offset();
            final long key = ((long) partition << 40) | offset;
            final boolean fail = !fromRetry && failsOnce(partition, offset);
            synchronized (SEEN) {
                SEEN.records++;
                if (SEEN.firstNanos == 0) {
                    SEEN.firstNanos = now;
                }
                SEEN.lastNanos = now;
                final int[] counts = SEEN.counts.computeIfAbsent(key, k -> new int[2]);
                counts[0]++;
                if (!fail) {
                    counts[1]++;
                }
                if (fromRetry) {
                    final Instant at = Instant.now();
                    SEEN.retryReceivedMicros.put(key, at.getEpochSecond() * 1_000_000L + at.getNano() / 1000);
                    SEEN.retriedAccepted++;
                } else if (fail) {
                    SEEN.released++;
                } else {
                    SEEN.clean++;
                    SEEN.cleanLastNanos = now;
                }
            }
            if (fail) {
                throw new IllegalStateException("failed once on purpose (the bench's 10 %)");
            }
        }
    }

    /** The retry topics' infrastructure, as @EnableKafkaRetryTopic would give it; with
     * -Dbench.verifyPartition=false (an experiment; the figures use Spring's default, true) the recoverer
     * that writes the retry records does not look up the retry topic's partitions before each write. */
    @Configuration
    public static class RetrySupport extends RetryTopicConfigurationSupport {
        @Override
        protected void configureCustomizers(final CustomizersConfigurer customizers) {
            final String verify = System.getProperty("bench.verifyPartition");
            if (verify != null) {
                customizers.customizeDeadLetterPublishingRecoverer(
                    recoverer -> recoverer.setVerifyPartition(Boolean.parseBoolean(verify)));
            }
        }
    }

    /** The context: producer and consumer factories, the container factory, the scheduler the retry
     * topics' back-off needs, and the retry topic configuration. */
    @Configuration
    @EnableKafka
    @Import(RetrySupport.class)
    public static class Config {
        private static String bootstrap() {
            return System.getProperty("bench.bootstrap");
        }

        @Bean
        public KafkaTemplate<byte[], byte[]> kafkaTemplate() {
            final Map<String, Object> props = Map.of(
                ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap(),
                ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class,
                ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
            return new KafkaTemplate<>(new DefaultKafkaProducerFactory<>(props));
        }

        @Bean
        public ConsumerFactory<byte[], byte[]> consumerFactory() {
            final Map<String, Object> props = new HashMap<>(Map.of(
                ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap(),
                ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest",
                ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class,
                ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class));
            // bench.consumer.KEY=VALUE: a consumer setting (for experiments; the figures use none)
            for (final String name : System.getProperties().stringPropertyNames()) {
                if (name.startsWith("bench.consumer.")) {
                    props.put(name.substring("bench.consumer.".length()), System.getProperty(name));
                }
            }
            return new DefaultKafkaConsumerFactory<>(props);
        }

        @Bean
        public ConcurrentKafkaListenerContainerFactory<byte[], byte[]> kafkaListenerContainerFactory(
                final ConsumerFactory<byte[], byte[]> consumerFactory) {
            final ConcurrentKafkaListenerContainerFactory<byte[], byte[]> factory =
                new ConcurrentKafkaListenerContainerFactory<>();
            factory.setConsumerFactory(consumerFactory);
            return factory;
        }

        @Bean
        public TaskScheduler taskScheduler() {
            return new ThreadPoolTaskScheduler();
        }

        @Bean
        public RetryTopicConfiguration retryTopics(final KafkaTemplate<byte[], byte[]> template) {
            return RetryTopicConfigurationBuilder.newInstance()
                .fixedBackOff(2000L)
                .maxAttempts(2)
                .retryTopicSuffix(System.getProperty("bench.retrySuffix"))
                .dltSuffix(System.getProperty("bench.dltSuffix"))
                .doNotAutoCreateRetryTopics()
                .create(template);
        }

        @Bean
        public Listener listener() {
            return new Listener();
        }
    }

    private static String statsJson() {
        synchronized (SEEN) {
            return String.format(
                "{\"records\":%d,\"clean\":%d,\"released\":%d,\"retried_accepted\":%d,"
                    + "\"first_ns\":%d,\"clean_last_ns\":%d,\"last_ns\":%d,\"distinct\":%d}",
                SEEN.records, SEEN.clean, SEEN.released, SEEN.retriedAccepted, SEEN.firstNanos,
                SEEN.cleanLastNanos, SEEN.lastNanos, SEEN.counts.size());
        }
    }

    private static String dumpJson() {
        final StringBuilder out = new StringBuilder("{\"records\":[");
        synchronized (SEEN) {
            boolean first = true;
            for (final Map.Entry<Long, int[]> e : SEEN.counts.entrySet()) {
                final long key = e.getKey();
                final Long received = SEEN.retryReceivedMicros.get(key);
                out.append(first ? "" : ",").append('[').append(key >>> 40).append(',')
                    .append(key & ((1L << 40) - 1)).append(',').append(e.getValue()[0]).append(',')
                    .append(e.getValue()[1]).append(',').append(received == null ? 0L : received.longValue())
                    .append(']');
                first = false;
            }
        }
        return out.append("]}").toString();
    }

    private static String topicsJson(final KafkaListenerEndpointRegistry registry) {
        final TreeSet<String> topics = new TreeSet<>();
        for (final MessageListenerContainer container : registry.getListenerContainers()) {
            final Collection<TopicPartition> assigned = container.getAssignedPartitions();
            if (assigned != null) {
                assigned.forEach(tp -> topics.add(tp.topic()));
            }
        }
        final StringBuilder out = new StringBuilder("{\"assigned\":[");
        boolean first = true;
        for (final String topic : topics) {
            out.append(first ? "" : ",").append('"').append(topic).append('"');
            first = false;
        }
        return out.append("]}").toString();
    }

    public static void main(final String[] args) throws Exception {
        final PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        final AnnotationConfigApplicationContext context = new AnnotationConfigApplicationContext(Config.class);
        final KafkaListenerEndpointRegistry registry = context.getBean(KafkaListenerEndpointRegistry.class);
        out.println("{\"started\":true}");
        final BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            switch (line.trim()) {
                case "stats" -> out.println(statsJson());
                case "dump" -> out.println(dumpJson());
                case "topics" -> out.println(topicsJson(registry));
                default -> out.println("{\"error\":\"unknown command\"}");
            }
        }
        context.close();
    }
}

package dlqwriters;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Collection;
import java.util.Map;

import org.apache.kafka.connect.errors.ConnectException;
import org.apache.kafka.connect.sink.ErrantRecordReporter;
import org.apache.kafka.connect.sink.SinkRecord;
import org.apache.kafka.connect.sink.SinkTask;

/** The task of RecordingSinkConnector. */
public final class RecordingSinkTask extends SinkTask {
    private Path file;
    private ErrantRecordReporter reporter;

    @Override
    public void start(final Map<String, String> props) {
        file = Path.of(props.get("file"));
        reporter = context.errantRecordReporter();
    }

    @Override
    public void put(final Collection<SinkRecord> records) {
        final StringBuilder lines = new StringBuilder();
        for (final SinkRecord record : records) {
            if (record.value() instanceof Map<?, ?> map && Boolean.TRUE.equals(map.get("reject"))) {
                try {
                    reporter.report(record, new IllegalArgumentException("rejected by the sink: reject=true")).get();
                } catch (Exception e) {
                    throw new ConnectException("could not report a rejected record", e);
                }
                continue;
            }
            lines.append(record.topic()).append('/').append(record.kafkaPartition()).append('/')
                .append(record.kafkaOffset()).append('\n');
        }
        try {
            Files.writeString(file, lines, StandardCharsets.UTF_8, StandardOpenOption.CREATE, StandardOpenOption.APPEND);
        } catch (IOException e) {
            throw new ConnectException("could not write " + file, e);
        }
    }

    @Override
    public void stop() { }

    @Override
    public String version() {
        return "1";
    }
}

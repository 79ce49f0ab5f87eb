package dlqwriters;

import java.util.List;
import java.util.Map;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.sink.SinkConnector;

/**
 * A one-task sink connector for the DLQ tool's tests: its task appends each record it accepts to the file
 * named by "file", one line per record, and reports values that ask for it ({"reject": true}) to the
 * connector's dead-letter queue with the ErrantRecordReporter (KIP-610).
 */
public final class RecordingSinkConnector extends SinkConnector {
    private Map<String, String> props;

    @Override
    public void start(final Map<String, String> props) {
        this.props = props;
    }

    @Override
    public Class<? extends Task> taskClass() {
        return RecordingSinkTask.class;
    }

    @Override
    public List<Map<String, String>> taskConfigs(final int maxTasks) {
        return List.of(props);
    }

    @Override
    public void stop() { }

    @Override
    public ConfigDef config() {
        return new ConfigDef().define("file", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH, "output file");
    }

    @Override
    public String version() {
        return "1";
    }
}

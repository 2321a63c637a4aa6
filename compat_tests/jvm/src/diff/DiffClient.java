package diff;

/**
 * What the Java client sees, as JSON lines: one scenario run against one
 * server. The differential tests run it against Apache Kafka and against the
 * gateway and compare the lines field by field.
 *
 * <pre>DiffClient BOOTSTRAP SCENARIO TOPIC_PREFIX BASE_TIMESTAMP_MS</pre>
 *
 * Scenarios: "log" (produce with each codec, offsets, listOffsets at both
 * isolation levels and by timestamp, offsetsForTimes, seek and poll inside
 * batches, at and past the end, deleteRecords), "admin" (topic errors,
 * configs, describeTopics and describeCluster) and "group" (a subscribed
 * consumer, commitSync, and the consumer-group admin calls).
 */
public final class DiffClient {
    private DiffClient() {
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], prefix = args[2];
        long t0 = Long.parseLong(args[3]);
        Scenario scenario = switch (args[1]) {
            case "log" -> new LogScenario(bootstrap, prefix, t0);
            case "admin" -> new AdminScenario(bootstrap, prefix, t0);
            case "group" -> new GroupScenario(bootstrap, prefix, t0);
            default -> throw new IllegalArgumentException("unknown scenario " + args[1]);
        };
        scenario.run();
    }
}

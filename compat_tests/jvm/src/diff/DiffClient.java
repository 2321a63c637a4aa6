package diff;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

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
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final String[] CODECS = {"none", "gzip", "snappy", "lz4", "zstd"};

    private final String bootstrap;
    private final String prefix;
    private final long t0;

    private DiffClient(String bootstrap, String prefix, long t0) {
        this.bootstrap = bootstrap;
        this.prefix = prefix;
        this.t0 = t0;
    }

    public static void main(String[] args) throws Exception {
        DiffClient client = new DiffClient(args[0], args[2], Long.parseLong(args[3]));
        switch (args[1]) {
            case "log" -> client.log();
            case "admin" -> client.adminScenario();
            case "group" -> client.group();
            default -> throw new IllegalArgumentException("unknown scenario " + args[1]);
        }
    }

    // ------------------------------------------------------------------ output
    private static void emit(String step, Map<String, Object> fields) throws Exception {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("step", step);
        line.putAll(fields);
        System.out.println(JSON.writeValueAsString(line));
        System.out.flush();
    }

    private static Map<String, Object> map(Object... pairs) {
        Map<String, Object> out = new LinkedHashMap<>();
        for (int i = 0; i < pairs.length; i += 2) {
            out.put((String) pairs[i], pairs[i + 1]);
        }
        return out;
    }

    /** The exception a client call ended with, by class: messages are each server's own. */
    private static String failure(Throwable error) {
        Throwable cause = error instanceof ExecutionException && error.getCause() != null
            ? error.getCause() : error;
        return cause.getClass().getSimpleName();
    }

    private static Object outcome(Future<?> future) {
        try {
            future.get();
            return "ok";
        } catch (Exception e) {
            return failure(e);
        }
    }

    // ------------------------------------------------------------------ clients
    private Admin admin() {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        return Admin.create(props);
    }

    private KafkaProducer<byte[], byte[]> producer(String codec) {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
        props.put(ProducerConfig.LINGER_MS_CONFIG, "60000"); // one batch per flush
        props.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "30000");
        return new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
    }

    private KafkaConsumer<byte[], byte[]> consumer(String reset, String isolation) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, reset);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "1000");
        return new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    private static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    private static String text(byte[] data) {
        return data == null ? null : new String(data, StandardCharsets.UTF_8);
    }

    // ------------------------------------------------------------------ log
    private void log() throws Exception {
        String topic = prefix + "-log";
        List<TopicPartition> partitions = List.of(
            new TopicPartition(topic, 0), new TopicPartition(topic, 1), new TopicPartition(topic, 2));
        try (Admin admin = admin()) {
            emit("create", map("outcome", outcome(admin.createTopics(
                List.of(new NewTopic(topic, 3, (short) 1))).all())));
            produce(topic);
            listOffsets(admin, partitions);
            try (KafkaConsumer<byte[], byte[]> consumer = consumer("none", "read_uncommitted")) {
                positions(consumer, partitions);
                read(consumer, "read-all", partitions, Map.of(0, 0L, 1, 0L, 2, 0L));
                read(consumer, "read-inside-batches", partitions, Map.of(0, 5L, 1, 3L, 2, 1L));
                read(consumer, "read-at-end", partitions, Map.of(0, 9L, 1, 8L, 2, 4L));
                read(consumer, "read-past-end", partitions, Map.of(0, 50L));
            }
            emit("delete-records", map("low_watermarks", deleteRecords(admin, Map.of(
                new TopicPartition(topic, 0), 4L, new TopicPartition(topic, 1), 8L))));
            listOffsets(admin, partitions);
            try (KafkaConsumer<byte[], byte[]> consumer = consumer("none", "read_uncommitted")) {
                positions(consumer, partitions);
                read(consumer, "read-deleted", partitions, Map.of(0, 1L));
                read(consumer, "read-after-delete", partitions, Map.of(0, 4L, 1, 8L));
            }
            try (KafkaConsumer<byte[], byte[]> consumer = consumer("earliest", "read_committed")) {
                read(consumer, "reset-to-earliest", partitions, Map.of(0, 2L, 1, 0L, 2, 0L));
            }
        }
    }

    /** p0: one record at a time, then a batch; p1: one batch per codec; p2: a few. */
    private void produce(String topic) throws Exception {
        try (KafkaProducer<byte[], byte[]> producer = producer("none")) {
            for (int i = 0; i < 3; i++) {
                Future<RecordMetadata> sent = producer.send(new ProducerRecord<>(topic, 0, t0 + i,
                    bytes("k" + i), bytes("single-" + i)));
                producer.flush(); // one record per batch
                emit("produce-single", metadata(sent.get()));
            }
        }
        for (int c = 0; c < CODECS.length; c++) {
            try (KafkaProducer<byte[], byte[]> producer = producer(CODECS[c])) {
                List<Future<RecordMetadata>> sent = new ArrayList<>();
                int partition = c == 0 ? 0 : 1;
                for (int i = 0; i < (c == 0 ? 6 : 2); i++) {
                    ProducerRecord<byte[], byte[]> record = new ProducerRecord<>(topic, partition,
                        t0 + 1000L * (c + 1) + 10L * i, bytes("key-" + i),
                        bytes(CODECS[c] + "-" + i + "-" + "x".repeat(100)));
                    record.headers().add("codec", bytes(CODECS[c]));
                    sent.add(producer.send(record));
                }
                producer.flush();
                for (Future<RecordMetadata> future : sent) {
                    emit("produce-" + CODECS[c], metadata(future.get()));
                }
            }
        }
        try (KafkaProducer<byte[], byte[]> producer = producer("gzip")) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < 4; i++) {
                sent.add(producer.send(new ProducerRecord<>(topic, 2, t0 + 9000L + i, null,
                    i == 2 ? null : bytes("p2-" + i))));
            }
            producer.flush();
            for (Future<RecordMetadata> future : sent) {
                emit("produce-p2", metadata(future.get()));
            }
        }
    }

    private static Map<String, Object> metadata(RecordMetadata sent) {
        return map("partition", sent.partition(), "offset", sent.offset(),
                   "timestamp", sent.timestamp(), "key_size", sent.serializedKeySize(),
                   "value_size", sent.serializedValueSize());
    }

    private void listOffsets(Admin admin, List<TopicPartition> partitions) throws Exception {
        Map<String, OffsetSpec> specs = new LinkedHashMap<>();
        specs.put("earliest", OffsetSpec.earliest());
        specs.put("latest", OffsetSpec.latest());
        specs.put("max-timestamp", OffsetSpec.maxTimestamp());
        long[] times = {t0 - 5000, t0, t0 + 1, t0 + 1015, t0 + 1050, t0 + 2005, t0 + 3010,
                        t0 + 5000, t0 + 9002, t0 + 99_999};
        for (long time : times) {
            specs.put("at-" + (time - t0), OffsetSpec.forTimestamp(time));
        }
        for (IsolationLevel isolation : IsolationLevel.values()) {
            for (Map.Entry<String, OffsetSpec> spec : specs.entrySet()) {
                Map<TopicPartition, OffsetSpec> request = new LinkedHashMap<>();
                partitions.forEach(tp -> request.put(tp, spec.getValue()));
                Map<String, Object> fields = new LinkedHashMap<>();
                try {
                    Map<TopicPartition, ListOffsetsResultInfo> result = admin.listOffsets(
                        request, new ListOffsetsOptions(isolation)).all().get();
                    for (TopicPartition tp : partitions) {
                        ListOffsetsResultInfo info = result.get(tp);
                        fields.put("p" + tp.partition(), map("offset", info.offset(),
                            "timestamp", info.timestamp(),
                            "leader_epoch", info.leaderEpoch().orElse(null)));
                    }
                } catch (ExecutionException e) {
                    fields.put("error", failure(e));
                }
                emit("list-offsets-" + isolation.name().toLowerCase() + "-" + spec.getKey(), fields);
            }
        }
    }

    private void positions(KafkaConsumer<byte[], byte[]> consumer, List<TopicPartition> partitions)
            throws Exception {
        emit("beginning-offsets", map("offsets", byPartition(consumer.beginningOffsets(partitions))));
        emit("end-offsets", map("offsets", byPartition(consumer.endOffsets(partitions))));
        for (long delta : new long[] {-1000, 0, 15, 1010, 2000, 9003, 50_000}) {
            Map<TopicPartition, Long> query = new LinkedHashMap<>();
            partitions.forEach(tp -> query.put(tp, t0 + delta));
            Map<String, Object> found = new TreeMap<>();
            consumer.offsetsForTimes(query).forEach((tp, at) -> found.put("p" + tp.partition(),
                at == null ? null : map("offset", at.offset(), "timestamp", at.timestamp(),
                                        "leader_epoch", at.leaderEpoch().orElse(null))));
            emit("offsets-for-times-" + delta, found);
        }
    }

    private static Map<String, Object> byPartition(Map<TopicPartition, Long> offsets) {
        Map<String, Object> out = new TreeMap<>();
        offsets.forEach((tp, offset) -> out.put("p" + tp.partition(), offset));
        return out;
    }

    /** Seek each partition to its offset and poll until every one reaches its end. */
    private void read(KafkaConsumer<byte[], byte[]> consumer, String step,
                      List<TopicPartition> all, Map<Integer, Long> starts) throws Exception {
        List<TopicPartition> assigned = new ArrayList<>();
        all.stream().filter(tp -> starts.containsKey(tp.partition())).forEach(assigned::add);
        consumer.assign(assigned);
        for (TopicPartition tp : assigned) {
            consumer.seek(tp, starts.get(tp.partition()));
        }
        Map<TopicPartition, Long> ends = consumer.endOffsets(assigned);
        List<Object> records = new ArrayList<>();
        String error = null;
        long deadline = System.currentTimeMillis() + 20_000;
        try {
            do { // at least one poll: a position out of range only fails there
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    List<Object> headers = new ArrayList<>();
                    for (Header h : r.headers()) {
                        headers.add(List.of(h.key(), text(h.value())));
                    }
                    records.add(map("partition", r.partition(), "offset", r.offset(),
                        "timestamp", r.timestamp(), "timestamp_type", r.timestampType().name,
                        "key", text(r.key()), "value", text(r.value()), "headers", headers,
                        "leader_epoch", r.leaderEpoch().orElse(null),
                        "key_size", r.serializedKeySize(), "value_size", r.serializedValueSize()));
                }
            } while (System.currentTimeMillis() < deadline
                     && assigned.stream().anyMatch(tp -> consumer.position(tp) < ends.get(tp)));
        } catch (Exception e) {
            error = failure(e);
        }
        Map<String, Object> positions = new TreeMap<>();
        if (error == null) {
            assigned.forEach(tp -> positions.put("p" + tp.partition(), consumer.position(tp)));
        }
        emit(step, map("records", records, "positions", positions, "error", error));
    }

    private static Map<String, Object> deleteRecords(Admin admin, Map<TopicPartition, Long> before)
            throws Exception {
        Map<TopicPartition, RecordsToDelete> request = new LinkedHashMap<>();
        before.forEach((tp, offset) -> request.put(tp, RecordsToDelete.beforeOffset(offset)));
        Map<String, Object> out = new TreeMap<>();
        admin.deleteRecords(request).lowWatermarks().forEach((tp, future) -> {
            try {
                out.put("p" + tp.partition(), future.get().lowWatermark());
            } catch (Exception e) {
                out.put("p" + tp.partition(), failure(e));
            }
        });
        return out;
    }

    // ------------------------------------------------------------------ group
    private void group() throws Exception {
        String topic = prefix + "-group", groupId = prefix + "-g";
        try (Admin admin = admin()) {
            emit("create", map("outcome", outcome(admin.createTopics(
                List.of(new NewTopic(topic, 3, (short) 1))).all())));
            try (KafkaProducer<byte[], byte[]> producer = producer("none")) {
                for (int i = 0; i < 9; i++) {
                    producer.send(new ProducerRecord<>(topic, i % 3, t0 + i, null, bytes("g" + i)));
                }
                producer.flush();
            }
            Properties props = new Properties();
            props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            props.put(ConsumerConfig.GROUP_ID_CONFIG, groupId);
            props.put(ConsumerConfig.CLIENT_ID_CONFIG, "diff-consumer");
            props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
            props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
            try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props,
                    new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
                consumer.subscribe(List.of(topic));
                Map<Integer, Integer> counts = new TreeMap<>();
                long deadline = System.currentTimeMillis() + 30_000;
                int total = 0;
                while (total < 9 && System.currentTimeMillis() < deadline) {
                    for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                        counts.merge(r.partition(), 1, Integer::sum);
                        total++;
                    }
                }
                List<Integer> assigned = new ArrayList<>();
                consumer.assignment().forEach(tp -> assigned.add(tp.partition()));
                assigned.sort(null);
                emit("consumed", map("per_partition", counts, "assignment", assigned));
                consumer.commitSync();
                Map<String, Object> committed = new TreeMap<>();
                consumer.committed(consumer.assignment()).forEach((tp, at) -> committed.put(
                    "p" + tp.partition(), at == null ? null : at.offset()));
                emit("committed", committed);
                describeGroup(admin, "describe-active", groupId);
                emit("group-offsets-active", groupOffsets(admin, groupId));
            }
            describeGroup(admin, "describe-after-close", groupId);
            emit("alter-offsets", map("outcome", outcome(admin.alterConsumerGroupOffsets(groupId,
                Map.of(new TopicPartition(topic, 0), new org.apache.kafka.clients.consumer
                    .OffsetAndMetadata(1, "meta"))).all())));
            emit("delete-offsets", map("outcome", outcome(admin.deleteConsumerGroupOffsets(
                groupId, java.util.Set.of(new TopicPartition(topic, 1))).all())));
            emit("group-offsets-altered", groupOffsets(admin, groupId));
            emit("delete-group", map("outcome", outcome(admin.deleteConsumerGroups(
                List.of(groupId)).all())));
            describeGroup(admin, "describe-deleted", groupId);
            emit("delete-unknown-group", map("outcome", outcome(admin.deleteConsumerGroups(
                List.of(prefix + "-nope")).all())));
        }
    }

    private static void describeGroup(Admin admin, String step, String groupId) throws Exception {
        var description = admin.describeConsumerGroups(List.of(groupId)).all().get().get(groupId);
        List<Object> members = new ArrayList<>();
        description.members().forEach(m -> {
            List<Integer> partitions = new ArrayList<>();
            m.assignment().topicPartitions().forEach(tp -> partitions.add(tp.partition()));
            partitions.sort(null);
            members.add(map("client_id", m.clientId(), "static", m.groupInstanceId().isPresent(),
                            "partitions", partitions));
        });
        emit(step, map("state", description.state().toString(),
            "assignor", description.partitionAssignor(), "simple", description.isSimpleConsumerGroup(),
            "members", members, "coordinator_known", description.coordinator() != null));
    }

    private static Map<String, Object> groupOffsets(Admin admin, String groupId) throws Exception {
        Map<String, Object> out = new TreeMap<>();
        admin.listConsumerGroupOffsets(groupId).partitionsToOffsetAndMetadata().get().forEach(
            (tp, at) -> out.put("p" + tp.partition(), at == null ? null
                : map("offset", at.offset(), "metadata", at.metadata(),
                      "leader_epoch", at.leaderEpoch().orElse(null))));
        return out;
    }

    // ------------------------------------------------------------------ admin
    private void adminScenario() throws Exception {
        try (Admin admin = admin()) {
            Map<String, NewTopic> bad = new LinkedHashMap<>();
            bad.put("invalid-name", new NewTopic("bad name!", 1, (short) 1));
            bad.put("too-long", new NewTopic("t".repeat(250), 1, (short) 1));
            bad.put("replication-3", new NewTopic(prefix + "-rf", 1, (short) 3));
            bad.put("no-partitions", new NewTopic(prefix + "-np", 0, (short) 1));
            bad.put("bad-config", new NewTopic(prefix + "-cfg", 1, (short) 1)
                .configs(Map.of("retention.ms", "1_000")));
            bad.put("huge-int", new NewTopic(prefix + "-huge", 1, (short) 1)
                .configs(Map.of("max.message.bytes", "1099511627776")));
            bad.put("unknown-config", new NewTopic(prefix + "-unk", 1, (short) 1)
                .configs(Map.of("no.such.config", "1")));
            for (Map.Entry<String, NewTopic> entry : bad.entrySet()) {
                emit("create-" + entry.getKey(), map("outcome",
                    outcome(admin.createTopics(List.of(entry.getValue())).all())));
            }
            String dotted = prefix + ".col", underscored = prefix + "_col";
            emit("create-dotted", map("outcome", outcome(admin.createTopics(
                List.of(new NewTopic(dotted, 1, (short) 1))).all())));
            emit("create-colliding", map("outcome", outcome(admin.createTopics(
                List.of(new NewTopic(underscored, 1, (short) 1))).all())));

            String plain = prefix + "-plain", custom = prefix + "-custom";
            emit("create-plain", map("outcome", outcome(admin.createTopics(
                List.of(new NewTopic(plain, 2, (short) 1))).all())));
            emit("create-custom", map("outcome", outcome(admin.createTopics(List.of(
                new NewTopic(custom, 1, (short) 1).configs(Map.of(
                    "retention.ms", "3600000", "max.message.bytes", "1000",
                    "min.cleanable.dirty.ratio", "0.25", "cleanup.policy", "delete")))).all())));
            describeConfigs(admin, "describe-plain", plain);
            describeConfigs(admin, "describe-custom", custom);

            ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, custom);
            Map<String, String> values = new LinkedHashMap<>();
            values.put("set-retention", "retention.ms=7200000");
            values.put("set-ratio-nan", "min.cleanable.dirty.ratio=nan");
            values.put("set-underscore", "segment.ms=1_000");
            values.put("set-arabic-digits", "segment.ms=\u0661\u0660\u0660\u0660");
            values.put("set-unknown", "no.such.config=1");
            for (Map.Entry<String, String> entry : values.entrySet()) {
                String[] kv = entry.getValue().split("=", 2);
                emit("alter-" + entry.getKey(), map("outcome", outcome(admin.incrementalAlterConfigs(
                    Map.of(resource, List.of(new AlterConfigOp(new ConfigEntry(kv[0], kv[1]),
                        AlterConfigOp.OpType.SET)))).all())));
            }
            describeConfigs(admin, "describe-altered", custom);

            Map<String, TopicDescription> topics = admin.describeTopics(List.of(plain))
                .allTopicNames().get();
            TopicDescription described = topics.get(plain);
            List<Object> parts = new ArrayList<>();
            described.partitions().forEach(p -> parts.add(map("partition", p.partition(),
                "replicas", p.replicas().size(), "isr", p.isr().size(),
                "leader_is_a_replica", p.replicas().contains(p.leader()))));
            emit("describe-topic", map("name", described.name(), "internal", described.isInternal(),
                "partitions", parts));
            emit("describe-unknown-topic", map("outcome", outcome(admin.describeTopics(
                List.of(prefix + "-nope")).allTopicNames())));
            var cluster = admin.describeCluster();
            Collection<?> nodes = cluster.nodes().get();
            emit("describe-cluster", map("nodes", nodes.size(),
                "controller_is_a_node", nodes.contains(cluster.controller().get())));
            tooLarge(custom);
        }
    }

    private static void describeConfigs(Admin admin, String step, String topic) throws Exception {
        ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        Config config = admin.describeConfigs(List.of(resource),
            new DescribeConfigsOptions().includeSynonyms(true)).all().get().get(resource);
        Map<String, Object> entries = new TreeMap<>();
        for (ConfigEntry entry : config.entries()) {
            List<Object> synonyms = new ArrayList<>();
            entry.synonyms().forEach(s -> synonyms.add(List.of(s.name(), String.valueOf(s.value()),
                s.source().name())));
            entries.put(entry.name(), map("value", entry.value(), "source", entry.source().name(),
                "default", entry.isDefault(), "read_only", entry.isReadOnly(),
                "sensitive", entry.isSensitive(), "type", entry.type().name(),
                "synonyms", synonyms));
        }
        emit(step, entries);
    }

    /** A record over the topic's max.message.bytes (1000). */
    private void tooLarge(String topic) throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
        props.put(ProducerConfig.RETRIES_CONFIG, "0");
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props,
                new ByteArraySerializer(), new ByteArraySerializer())) {
            emit("produce-too-large", map("outcome", outcome(producer.send(
                new ProducerRecord<>(topic, 0, t0, null, new byte[2000])))));
            emit("produce-fits", map("outcome", outcome(producer.send(
                new ProducerRecord<>(topic, 0, t0, null, new byte[100])))));
        }
    }
}

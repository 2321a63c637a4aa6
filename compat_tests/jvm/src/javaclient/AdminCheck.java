package javaclient;

import static javaclient.Kit.emit;
import static javaclient.Kit.error;
import static javaclient.Kit.map;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.ConsumerGroupListing;
import org.apache.kafka.clients.admin.CreateTopicsResult;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.ListConsumerGroupsOptions;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.ConsumerGroupState;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;

/**
 * The Java AdminClient against a broker, one scenario per command:
 *
 *   topics  --bootstrap B --topic T    create, list, describe, configs, partitions, delete
 *   cluster --bootstrap B              describeCluster
 *   offsets --bootstrap B --topic T --base-timestamp TS
 *                                      two batches, then listOffsets (both isolation levels)
 *   delete-records --bootstrap B --topic T --base-timestamp TS
 *                                      deleteRecords, and listOffsets after each
 *   groups  --bootstrap B --topic T --group G --standalone S   consumer-group admin
 *
 * Each step prints one JSON line whose "op" names it; failures a step expects
 * are printed as {"error": class, "message": ...} and the scenario goes on.
 */
public final class AdminCheck {
    private static final List<String> WATCHED = List.of(
            "retention.ms", "max.message.bytes", "cleanup.policy", "segment.bytes");

    public static void main(String[] args) throws Exception {
        Kit kit = Kit.parse(args);
        try (Admin admin = Admin.create(kit.admin())) {
            switch (kit.command) {
                case "topics" -> topics(admin, kit.get("topic"));
                case "cluster" -> cluster(admin);
                case "offsets" -> offsets(kit, admin, kit.get("topic"));
                case "delete-records" -> deleteRecords(kit, admin, kit.get("topic"));
                case "groups" -> groups(kit, admin, kit.get("topic"), kit.get("group"),
                        kit.get("standalone"));
                default -> throw new IllegalArgumentException("unknown command " + kit.command);
            }
        }
    }

    // ---------------------------------------------------------------- topics

    @SuppressWarnings("deprecation")  // alterConfigs: the legacy API is tested on purpose
    private static void topics(Admin admin, String topic) throws Exception {
        CreateTopicsResult created = admin.createTopics(List.of(
                new NewTopic(topic, 2, (short) 1).configs(Map.of("retention.ms", "3600000"))));
        created.all().get();
        emit("op", "create", "partitions", created.numPartitions(topic).get(),
                "replication", (int) created.replicationFactor(topic).get(),
                "topic_id", created.topicId(topic).get().toString(),
                "retention.ms", created.config(topic).get().get("retention.ms").value());
        emit("op", "list", "present", admin.listTopics().names().get().contains(topic));
        describeTopic(admin, topic);
        describeConfigs(admin, topic, "configs");

        ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        alter(admin, resource, "set", List.of(
                new AlterConfigOp(new ConfigEntry("retention.ms", "7200000"), AlterConfigOp.OpType.SET),
                new AlterConfigOp(new ConfigEntry("max.message.bytes", "2000000"),
                        AlterConfigOp.OpType.SET)));
        alter(admin, resource, "delete", List.of(
                new AlterConfigOp(new ConfigEntry("retention.ms", null), AlterConfigOp.OpType.DELETE)));
        alter(admin, resource, "invalid", List.of(
                new AlterConfigOp(new ConfigEntry("retention.ms", "soon"), AlterConfigOp.OpType.SET)));
        // The legacy AlterConfigs replaces every override of the resource.
        attempt("alter_legacy", () -> legacyAlterConfigs(admin, Map.of(resource,
                new Config(List.of(new ConfigEntry("segment.bytes", "536870912"))))));
        describeConfigs(admin, topic, "configs_after_legacy");

        attempt("grow", () -> admin.createPartitions(
                Map.of(topic, NewPartitions.increaseTo(4))).all().get());
        describeTopic(admin, topic);
        attempt("shrink", () -> admin.createPartitions(
                Map.of(topic, NewPartitions.increaseTo(3))).all().get());
        attempt("create_again", () -> admin.createTopics(
                List.of(new NewTopic(topic, 1, (short) 1))).all().get());
        attempt("delete", () -> admin.deleteTopics(List.of(topic)).all().get());
        emit("op", "list_after_delete", "present", admin.listTopics().names().get().contains(topic));
        attempt("describe_deleted", () -> admin.describeTopics(List.of(topic)).allTopicNames().get());
    }

    /**
     * Admin.alterConfigs (the legacy AlterConfigs request), called by reflection:
     * the 4.x client removed it, and one source compiles against both lines. On
     * 4.x the step fails with NoSuchMethodException, before any request is sent.
     */
    private static void legacyAlterConfigs(Admin admin, Map<ConfigResource, Config> configs)
            throws Exception {
        Object result = Admin.class.getMethod("alterConfigs", Map.class).invoke(admin, configs);
        ((KafkaFuture<?>) result.getClass().getMethod("all").invoke(result)).get();
    }

    private static void describeTopic(Admin admin, String topic) throws Exception {
        TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
        List<Object> partitions = new ArrayList<>();
        for (TopicPartitionInfo p : d.partitions()) {
            partitions.add(map("partition", p.partition(), "leader", p.leader().id(),
                    "replicas", ids(p.replicas()), "isr", ids(p.isr())));
        }
        emit("op", "describe", "name", d.name(), "internal", d.isInternal(),
                "topic_id", d.topicId().toString(), "partitions", partitions);
    }

    private static List<Integer> ids(List<Node> nodes) {
        return nodes.stream().map(Node::id).toList();
    }

    private static void describeConfigs(Admin admin, String topic, String op) throws Exception {
        ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        Config config = admin.describeConfigs(List.of(resource)).all().get().get(resource);
        Map<String, Object> watched = new LinkedHashMap<>();
        for (String name : WATCHED) {
            ConfigEntry e = config.get(name);
            watched.put(name, List.of(e.value(), e.source().name(), e.isReadOnly(),
                    e.isSensitive(), e.type().name()));
        }
        emit("op", op, "count", config.entries().size(), "watched", watched);
    }

    private static void alter(Admin admin, ConfigResource resource, String op,
                              Collection<AlterConfigOp> ops) throws Exception {
        attempt("alter_" + op,
                () -> admin.incrementalAlterConfigs(Map.of(resource, ops)).all().get());
        describeConfigs(admin, resource.name(), "configs_after_" + op);
    }

    // ---------------------------------------------------------------- cluster

    private static void cluster(Admin admin) throws Exception {
        DescribeClusterResult cluster = admin.describeCluster();
        Node controller = cluster.controller().get();
        List<Object> nodes = new ArrayList<>();
        for (Node n : cluster.nodes().get()) {
            nodes.add(map("id", n.id(), "host", n.host(), "port", n.port(), "rack", n.rack()));
        }
        emit("op", "cluster", "cluster_id", cluster.clusterId().get(),
                "controller", map("id", controller.id(), "host", controller.host(),
                        "port", controller.port()), "nodes", nodes,
                "client_version", clientVersion());
    }

    /** The kafka-clients version on the classpath, from the file its AppInfoParser
     *  reads (a class that moved between the lines: the file did not). */
    static String clientVersion() throws Exception {
        Properties props = new Properties();
        try (var in = Admin.class.getResourceAsStream("/kafka/kafka-version.properties")) {
            props.load(in);
        }
        return props.getProperty("version");
    }

    // ---------------------------------------------------------------- offsets

    /**
     * Two batches of ten records, the second holding the largest timestamp in
     * its middle (offset 14); then every OffsetSpec at both isolation levels.
     */
    private static void offsets(Kit kit, Admin admin, String topic) throws Exception {
        admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
        long base = Long.parseLong(kit.get("base-timestamp"));
        ProduceCheck.sendBatches(kit, topic, "none", List.of(10, 10),
                i -> i == 14 ? base + 100_000 : base + 10L * i);
        listOffsets(admin, new TopicPartition(topic, 0), base, "before_delete");
    }

    /** Delete below offset 13, past the end, then everything (-1: the high watermark). */
    private static void deleteRecords(Kit kit, Admin admin, String topic) throws Exception {
        long base = Long.parseLong(kit.get("base-timestamp"));
        TopicPartition tp = new TopicPartition(topic, 0);
        attempt("delete_records_13", () -> emit("op", "low_watermark", "value",
                admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(13)))
                        .lowWatermarks().get(tp).get().lowWatermark()));
        listOffsets(admin, tp, base, "after_delete");
        attempt("delete_records_past_end", () -> admin.deleteRecords(
                Map.of(tp, RecordsToDelete.beforeOffset(21))).all().get());
        attempt("delete_records_all", () -> emit("op", "low_watermark", "value",
                admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(-1)))
                        .lowWatermarks().get(tp).get().lowWatermark()));
        listOffsets(admin, tp, base, "after_delete_all");
    }

    private static void listOffsets(Admin admin, TopicPartition tp, long base, String phase)
            throws Exception {
        Map<String, OffsetSpec> specs = new LinkedHashMap<>();
        specs.put("earliest", OffsetSpec.earliest());
        specs.put("latest", OffsetSpec.latest());
        specs.put("max_timestamp", OffsetSpec.maxTimestamp());
        for (long ts : new long[] {-1, 30, 35, 155, 190, 100_000, 100_001}) {
            specs.put("ts" + ts, OffsetSpec.forTimestamp(base + ts));  // relative to base
        }
        for (IsolationLevel level : IsolationLevel.values()) {
            Map<String, Object> found = new LinkedHashMap<>();
            for (Map.Entry<String, OffsetSpec> spec : specs.entrySet()) {
                ListOffsetsResultInfo info = admin.listOffsets(Map.of(tp, spec.getValue()),
                        new ListOffsetsOptions(level)).partitionResult(tp).get();
                long ts = info.timestamp() < 0 ? info.timestamp() : info.timestamp() - base;
                found.put(spec.getKey(), List.of(info.offset(), ts));
            }
            emit("op", "list_offsets", "phase", phase, "isolation", level.name(), "found", found);
        }
    }

    // ---------------------------------------------------------------- groups

    /**
     * A subscribed member of {@code group} that committed its offsets (with
     * metadata), and a group {@code standalone} known only by the offsets an
     * assign()-ing consumer committed; then every consumer-group admin call.
     */
    private static void groups(Kit kit, Admin admin, String topic, String group,
                               String standalone) throws Exception {
        admin.createTopics(List.of(new NewTopic(topic, 2, (short) 1))).all().get();
        try (var producer = new KafkaProducer<byte[], byte[]>(kit.producer())) {
            for (int i = 0; i < 10; i++) {
                producer.send(new ProducerRecord<>(topic, i % 2, null, Kit.bytes("v" + i)));
            }
            producer.flush();
        }
        TopicPartition p0 = new TopicPartition(topic, 0);
        TopicPartition p1 = new TopicPartition(topic, 1);
        var assigner = new KafkaConsumer<byte[], byte[]>(kit.consumer(standalone));
        assigner.assign(List.of(p0));
        assigner.commitSync(Map.of(p0, new OffsetAndMetadata(3, "manual")));
        assigner.close();

        var props = kit.consumer(group);
        props.put("client.id", "member-" + group);
        props.put("heartbeat.interval.ms", "500");
        var member = new KafkaConsumer<byte[], byte[]>(props);
        member.subscribe(List.of(topic));
        int consumed = 0;
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (consumed < 10 && System.nanoTime() < deadline) {
            ConsumerRecords<byte[], byte[]> records = member.poll(Duration.ofMillis(200));
            consumed += records.count();
        }
        emit("op", "member_consumed", "count", consumed);
        member.commitSync(Map.of(p0, new OffsetAndMetadata(5, "m-0"),
                p1, new OffsetAndMetadata(5, "m-1")));

        listGroups(admin, group, standalone, "list_groups", new ListConsumerGroupsOptions());
        listGroups(admin, group, standalone, "list_empty_groups",
                new ListConsumerGroupsOptions().inStates(Set.of(ConsumerGroupState.EMPTY)));
        describeGroup(admin, group);
        describeGroup(admin, standalone);
        groupOffsets(admin, group);
        groupOffsets(admin, standalone);

        attempt("alter_active", () -> admin.alterConsumerGroupOffsets(group,
                Map.of(p1, new OffsetAndMetadata(7))).all().get());
        attempt("alter_standalone", () -> admin.alterConsumerGroupOffsets(standalone,
                Map.of(p1, new OffsetAndMetadata(7))).all().get());
        groupOffsets(admin, standalone);
        attempt("delete_offsets_subscribed", () -> admin.deleteConsumerGroupOffsets(group,
                Set.of(p0)).all().get());
        attempt("delete_offsets_standalone", () -> admin.deleteConsumerGroupOffsets(standalone,
                Set.of(p0)).all().get());
        groupOffsets(admin, standalone);
        attempt("delete_active", () -> admin.deleteConsumerGroups(List.of(group)).all().get());

        member.close();  // LeaveGroup: the group becomes empty
        deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (state(admin, group) != ConsumerGroupState.EMPTY && System.nanoTime() < deadline) {
            Thread.sleep(100);
        }
        describeGroup(admin, group);
        attempt("delete_both", () -> admin.deleteConsumerGroups(List.of(group, standalone))
                .all().get());
        describeGroup(admin, group);
        groupOffsets(admin, group);
        listGroups(admin, group, standalone, "list_after_delete", new ListConsumerGroupsOptions());
        attempt("delete_again", () -> admin.deleteConsumerGroups(List.of(group)).all().get());
    }

    private static ConsumerGroupState state(Admin admin, String group) throws Exception {
        return admin.describeConsumerGroups(List.of(group)).all().get().get(group).state();
    }

    private static void listGroups(Admin admin, String group, String standalone, String op,
                                   ListConsumerGroupsOptions options) throws Exception {
        Map<String, Object> found = new TreeMap<>();
        for (ConsumerGroupListing listing : admin.listConsumerGroups(options).all().get()) {
            if (listing.groupId().equals(group) || listing.groupId().equals(standalone)) {
                found.put(listing.groupId(), List.of(
                        listing.state().map(ConsumerGroupState::name).orElse("?"),
                        listing.isSimpleConsumerGroup()));
            }
        }
        emit("op", op, "groups", found);
    }

    private static void describeGroup(Admin admin, String group) throws Exception {
        ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(group)).all().get()
                .get(group);
        List<Object> members = new ArrayList<>();
        for (MemberDescription m : d.members()) {
            List<Object> assigned = new ArrayList<>();
            m.assignment().topicPartitions().stream()
                    .sorted((a, b) -> a.toString().compareTo(b.toString()))
                    .forEach(tp -> assigned.add(List.of(tp.topic(), tp.partition())));
            members.add(map("client_id", m.clientId(), "host", m.host(),
                    "member_id_prefix", m.consumerId().startsWith(m.clientId() + "-"),
                    "instance", m.groupInstanceId().orElse(null), "assignment", assigned));
        }
        emit("op", "describe_group", "group", d.groupId(), "state", d.state().name(),
                "simple", d.isSimpleConsumerGroup(), "assignor", d.partitionAssignor(),
                "coordinator", d.coordinator().id(), "members", members);
    }

    private static void groupOffsets(Admin admin, String group) throws Exception {
        Map<String, Object> found = new TreeMap<>();
        admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get().forEach(
                (tp, om) -> found.put(tp.toString(), om == null ? null
                        : List.of(om.offset(), om.metadata())));
        emit("op", "group_offsets", "group", group, "offsets", found);
    }

    // ---------------------------------------------------------------- helpers

    interface Step {
        void run() throws Exception;
    }

    /** Run a step; print {"op": op, "ok": true} or the error it failed with. */
    private static void attempt(String op, Step step) {
        try {
            step.run();
            emit("op", op, "ok", true);
        } catch (Exception e) {
            Map<String, Object> out = map("op", op, "ok", false);
            out.putAll(error(e));
            Kit.print(out);
        }
    }
}

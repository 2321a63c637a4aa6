package diff;

import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/** Topic errors, configs, describeTopics, describeCluster, a record too large. */
final class AdminScenario extends Scenario {
    AdminScenario(String bootstrap, String prefix, long t0) {
        super(bootstrap, prefix, t0);
    }

    @Override
    void run() throws Exception {
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

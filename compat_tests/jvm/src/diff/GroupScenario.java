package diff;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/** A subscribed consumer group and the consumer-group admin calls. */
final class GroupScenario extends Scenario {
    GroupScenario(String bootstrap, String prefix, long t0) {
        super(bootstrap, prefix, t0);
    }

    @Override
    void run() throws Exception {
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
                Map.of(new TopicPartition(topic, 0), new OffsetAndMetadata(1, "meta"))).all())));
            emit("delete-offsets", map("outcome", outcome(admin.deleteConsumerGroupOffsets(
                groupId, Set.of(new TopicPartition(topic, 1))).all())));
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
}

package javatxn;

import static javaclient.Kit.emit;

import java.time.Duration;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import javaclient.Kit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListConsumerGroupOffsetsOptions;
import org.apache.kafka.clients.admin.ListConsumerGroupOffsetsSpec;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;

/**
 * Consumer offsets in transactions (sendOffsetsToTransaction with the
 * consumer's group metadata, KIP-447), one scenario per command:
 *
 *   offsets --bootstrap B --topic T --group G --txn-id X
 *       source T (2 partitions), output T-out; a member of G holds T. A
 *       transaction commits offsets {2, 2}, one with {3, 4} aborts, one with
 *       {5, 6} is looked at while open (Admin listConsumerGroupOffsets with and
 *       without requireStable, the read_committed consumer's committed()),
 *       then commits
 *   conflict --bootstrap B --topic T --group G --variant late-offsets|late-commit
 *       two producers with different transactional ids both process offsets
 *       [0, 5) of T's one partition for group G, with the same member's group
 *       metadata. A commits first; B sends its offsets after A's commit
 *       (late-offsets) or before it (late-commit). What B's calls do; B then
 *       aborts and runs a new transaction (offset 10) with the same producer
 */
public final class OffsetsCheck {
    public static void main(String[] args) throws Exception {
        Kit kit = Kit.parse(args);
        switch (kit.command) {
            case "offsets" -> offsets(kit);
            case "conflict" -> conflict(kit);
            default -> throw new IllegalArgumentException("unknown command " + kit.command);
        }
    }

    /** A member of the group holding every partition of ``tps``' topic. */
    static KafkaConsumer<byte[], byte[]> member(Kit kit, List<TopicPartition> tps) {
        var props = Txn.consumer(kit, kit.get("group"), TxnCheck.COMMITTED);
        props.put("session.timeout.ms", "30000");
        var consumer = new KafkaConsumer<byte[], byte[]>(props);
        consumer.subscribe(List.of(tps.get(0).topic()));
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (consumer.assignment().size() < tps.size()) {
            Txn.check(deadline, "the member to be assigned " + tps);
            consumer.poll(Duration.ofMillis(100));
        }
        // Positions resolved: the member's own offset fetch is answered, so a
        // later committed() cannot reuse its pending answer (the client does).
        tps.forEach(tp -> consumer.position(tp, Kit.TIMEOUT));
        return consumer;
    }

    static void fill(Kit kit, String topic, int partitions, int perPartition) {
        try (var producer = new KafkaProducer<byte[], byte[]>(kit.producer())) {
            for (int i = 0; i < partitions * perPartition; i++) {
                producer.send(new ProducerRecord<>(topic, i % partitions, null,
                        Kit.bytes("s" + i)));
            }
            producer.flush();
        }
    }

    /** The group's offsets for ``tps`` through the Admin client, or how the call failed. */
    static Object listed(Admin admin, String group, List<TopicPartition> tps,
                         boolean requireStable) {
        var spec = new ListConsumerGroupOffsetsSpec().topicPartitions(tps);
        var options = new ListConsumerGroupOffsetsOptions().requireStable(requireStable);
        options.timeoutMs(5000);
        try {
            return Txn.offsets(admin.listConsumerGroupOffsets(Map.of(group, spec), options)
                    .partitionsToOffsetAndMetadata(group).get(30, TimeUnit.SECONDS));
        } catch (Exception e) {
            return Kit.error(e);
        }
    }

    /**
     * The group's offsets once a requireStable listing has every partition, and
     * how many listings that took: Apache Kafka writes a transaction's offsets
     * after EndTxn has answered, so right after commitTransaction() they may
     * still be pending (the Admin client leaves such partitions out).
     */
    static Map<String, Object> settled(Admin admin, String group, List<TopicPartition> tps)
            throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        for (int attempts = 1; ; attempts++) {
            Object got = listed(admin, group, tps, true);
            if (got instanceof Map<?, ?> m && m.size() == tps.size()) {
                return Kit.map("offsets", got, "attempts", attempts);
            }
            Txn.check(deadline, "stable offsets of " + tps);
            Thread.sleep(100);
        }
    }

    /** What the consumer's committed() answers (it asks with require_stable), or its error. */
    static Object committed(KafkaConsumer<byte[], byte[]> consumer, List<TopicPartition> tps,
                            Duration timeout) {
        try {
            return Txn.offsets(consumer.committed(new HashSet<>(tps), timeout));
        } catch (Exception e) {
            return Kit.error(e);
        }
    }

    private static void transaction(KafkaProducer<byte[], byte[]> producer,
                                    KafkaConsumer<byte[], byte[]> consumer, String out,
                                    String value, Map<TopicPartition, Long> offsets) {
        producer.beginTransaction();
        producer.send(new ProducerRecord<>(out, 0, null, Kit.bytes(value)));
        producer.sendOffsetsToTransaction(Txn.commitAt(offsets), consumer.groupMetadata());
    }

    private static void offsets(Kit kit) throws Exception {
        String topic = kit.get("topic");
        String out = topic + "-out";
        String group = kit.get("group");
        Txn.createTopics(kit, Map.of(topic, 2, out, 1));
        fill(kit, topic, 2, 10);
        List<TopicPartition> tps = Txn.partitions(topic, 2);
        TopicPartition p0 = tps.get(0);
        TopicPartition p1 = tps.get(1);
        try (var consumer = member(kit, tps); Admin admin = Admin.create(kit.admin());
             var producer = Txn.producer(kit, kit.get("txn-id"))) {
            producer.initTransactions();
            emit("op", "before", "stable", listed(admin, group, tps, true));

            transaction(producer, consumer, out, "committed-1", Map.of(p0, 2L, p1, 2L));
            producer.commitTransaction();
            emit("op", "after_commit", "stable", settled(admin, group, tps));

            transaction(producer, consumer, out, "aborted", Map.of(p0, 3L, p1, 4L));
            // Sent before the abort: an abort may drop a batch not sent yet, and
            // Kafka's log would then hold its ABORT marker without the record.
            producer.flush();
            producer.abortTransaction();
            emit("op", "after_abort", "stable", settled(admin, group, tps),
                    "unstable", listed(admin, group, tps, false));

            transaction(producer, consumer, out, "committed-2", Map.of(p0, 5L, p1, 6L));
            producer.flush();
            emit("op", "while_open", "stable", listed(admin, group, tps, true),
                    "unstable", listed(admin, group, tps, false),
                    "consumer_committed", committed(consumer, tps, Duration.ofSeconds(5)));
            producer.commitTransaction();
            emit("op", "after_second_commit", "stable", settled(admin, group, tps),
                    "consumer_committed", committed(consumer, tps, Kit.TIMEOUT));
        }
        emit("op", "output", "records",
                Txn.readAll(kit, Txn.partitions(out, 1), TxnCheck.COMMITTED));
    }

    private static void conflict(Kit kit) throws Exception {
        String topic = kit.get("topic");
        String out = topic + "-out";
        String group = kit.get("group");
        boolean lateOffsets = switch (kit.get("variant")) {
            case "late-offsets" -> true;
            case "late-commit" -> false;
            default -> throw new IllegalArgumentException("unknown variant");
        };
        Txn.createTopics(kit, Map.of(topic, 1, out, 1));
        fill(kit, topic, 1, 20);
        List<TopicPartition> tps = Txn.partitions(topic, 1);
        TopicPartition p0 = tps.get(0);
        Map<TopicPartition, Long> five = Map.of(p0, 5L);
        try (var consumer = member(kit, tps); Admin admin = Admin.create(kit.admin());
             var a = Txn.producer(kit, topic + "-A"); var b = Txn.producer(kit, topic + "-B")) {
            a.initTransactions();
            b.initTransactions();
            a.beginTransaction();
            a.send(new ProducerRecord<>(out, 0, null, Kit.bytes("a1")));
            b.beginTransaction();
            b.send(new ProducerRecord<>(out, 0, null, Kit.bytes("b1")));
            a.flush();
            b.flush();
            a.sendOffsetsToTransaction(Txn.commitAt(five), consumer.groupMetadata());
            Object bOffsets = null;
            if (!lateOffsets) {
                bOffsets = Txn.outcome(() -> b.sendOffsetsToTransaction(Txn.commitAt(five),
                        consumer.groupMetadata()));
            }
            emit("op", "a_commit", "outcome", Txn.outcome(a::commitTransaction));
            if (lateOffsets) {
                bOffsets = Txn.outcome(() -> b.sendOffsetsToTransaction(Txn.commitAt(five),
                        consumer.groupMetadata()));
            }
            emit("op", "b_offsets", "outcome", bOffsets);
            // The standard loop: an error at either step aborts the transaction.
            Object bCommit = "ok".equals(bOffsets) ? Txn.outcome(b::commitTransaction) : null;
            emit("op", "b_commit", "outcome", bCommit);
            if (!"ok".equals(bCommit)) {
                emit("op", "b_abort", "outcome", Txn.outcome(b::abortTransaction));
            }
            emit("op", "after_first_round", "stable", settled(admin, group, tps));
            // The same producer instance goes on: its next transaction commits.
            emit("op", "b_again", "outcome", Txn.outcome(() -> {
                b.beginTransaction();
                b.send(new ProducerRecord<>(out, 0, null, Kit.bytes("b2")));
                b.sendOffsetsToTransaction(Txn.commitAt(Map.of(p0, 10L)),
                        consumer.groupMetadata());
                b.commitTransaction();
            }));
            emit("op", "after_second_round", "stable", settled(admin, group, tps));
        }
        emit("op", "output", "records",
                Txn.readAll(kit, Txn.partitions(out, 1), TxnCheck.COMMITTED));
    }
}

package javatxn;

import static javaclient.Kit.emit;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import javaclient.Kit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;

/**
 * The Java producer's transactions, one scenario per command (every topic is
 * made by the program, so each runs against the gateway and Apache Kafka):
 *
 *   visibility --bootstrap B --topic T --txn-id X
 *       topics T-a (3 partitions) and T-b (2): a committed transaction, an
 *       aborted one (flushed first, and looked at while open), another
 *       committed one; the acks of each, the end offsets and records
 *       read_committed and read_uncommitted consumers see
 *   zombie --bootstrap B --topic T --txn-id X
 *       producer 1 opens a transaction and writes; producer 2 initTransactions
 *       with the same id; what producer 1's commit and abort then do; producer
 *       2 commits its own; what each isolation level reads
 *   timeout --bootstrap B --topic T --txn-id X
 *       a transaction with transaction.timeout.ms=2000 left open until the
 *       broker aborts it (DescribeTransactions shows it); then its commit
 *       and abort, and what is readable
 */
public final class TxnCheck {
    static final String COMMITTED = "read_committed";
    static final String UNCOMMITTED = "read_uncommitted";

    public static void main(String[] args) throws Exception {
        Kit kit = Kit.parse(args);
        switch (kit.command) {
            case "visibility" -> visibility(kit);
            case "zombie" -> zombie(kit);
            case "timeout" -> timeout(kit);
            default -> throw new IllegalArgumentException("unknown command " + kit.command);
        }
    }

    private static List<Future<RecordMetadata>> send(KafkaProducer<byte[], byte[]> producer,
                                                     List<TopicPartition> tps, String prefix,
                                                     int count) {
        List<Future<RecordMetadata>> futures = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            TopicPartition tp = tps.get(i % tps.size());
            futures.add(producer.send(new ProducerRecord<>(tp.topic(), tp.partition(), null,
                    Kit.bytes(prefix + "-" + i))));
        }
        return futures;
    }

    private static void reads(Kit kit, String op, List<TopicPartition> tps) {
        for (String isolation : List.of(COMMITTED, UNCOMMITTED)) {
            emit("op", op, "isolation", isolation, "end", Txn.endOffsets(kit, tps, isolation),
                    "records", Txn.readAll(kit, tps, isolation));
        }
    }

    private static void visibility(Kit kit) throws Exception {
        String a = kit.get("topic") + "-a";
        String b = kit.get("topic") + "-b";
        Txn.createTopics(kit, Map.of(a, 3, b, 2));
        List<TopicPartition> tps = new ArrayList<>(Txn.partitions(a, 3));
        tps.addAll(Txn.partitions(b, 2));
        try (var producer = Txn.producer(kit, kit.get("txn-id"))) {
            producer.initTransactions();
            producer.beginTransaction();
            var first = send(producer, tps, "c1", 10);
            producer.commitTransaction();
            emit("op", "commit1", "acks", Txn.acks(first));

            producer.beginTransaction();
            var aborted = send(producer, tps, "a2", 10);
            producer.flush();
            emit("op", "open_acks", "acks", Txn.acks(aborted));
            reads(kit, "while_open", tps);
            producer.abortTransaction();

            producer.beginTransaction();
            var third = send(producer, tps, "c3", 5);
            producer.commitTransaction();
            emit("op", "commit3", "acks", Txn.acks(third));
        }
        reads(kit, "after", tps);
    }

    private static void zombie(Kit kit) throws Exception {
        String topic = kit.get("topic");
        Txn.createTopics(kit, Map.of(topic, 2));
        List<TopicPartition> tps = Txn.partitions(topic, 2);
        String id = kit.get("txn-id");
        var first = Txn.producer(kit, id);
        first.initTransactions();
        first.beginTransaction();
        var zombieAcks = send(first, tps, "z1", 4);
        first.flush();
        emit("op", "zombie_acks", "acks", Txn.acks(zombieAcks));
        try (var second = Txn.producer(kit, id)) {
            emit("op", "second_init", "outcome", Txn.outcome(second::initTransactions));
            emit("op", "zombie_commit", "outcome", Txn.outcome(first::commitTransaction));
            emit("op", "zombie_abort", "outcome", Txn.outcome(first::abortTransaction));
            emit("op", "zombie_begin", "outcome", Txn.outcome(first::beginTransaction));
            first.close();
            second.beginTransaction();
            var acks = send(second, tps, "z2", 4);
            emit("op", "second_commit", "outcome", Txn.outcome(second::commitTransaction),
                    "acks", Txn.acks(acks));
        }
        reads(kit, "after", tps);
    }

    private static void timeout(Kit kit) throws Exception {
        String topic = kit.get("topic");
        Txn.createTopics(kit, Map.of(topic, 1));
        List<TopicPartition> tps = Txn.partitions(topic, 1);
        String id = kit.get("txn-id");
        try (var producer = Txn.producer(kit, id, 2000); Admin admin = Admin.create(kit.admin())) {
            producer.initTransactions();
            producer.beginTransaction();
            var acks = send(producer, tps, "t", 3);
            producer.flush();
            emit("op", "acks", "acks", Txn.acks(acks));
            TransactionDescription open = describe(admin, id);
            emit("op", "open", "state", open.state().toString(), "epoch", open.producerEpoch(),
                    "timeout_ms", open.transactionTimeoutMs());
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            TransactionDescription now = open;
            // Kafka passes through PrepareAbort while it writes the markers;
            // the outcome to compare is the state it settles in.
            while (List.of("Ongoing", "PrepareAbort").contains(now.state().toString())) {
                Txn.check(deadline, "the broker to abort the timed-out transaction");
                Thread.sleep(200);
                now = describe(admin, id);
            }
            emit("op", "timed_out", "state", now.state().toString(), "epoch",
                    now.producerEpoch(), "same_producer", now.producerId() == open.producerId(),
                    "partitions", now.topicPartitions().size());
            emit("op", "commit", "outcome", Txn.outcome(producer::commitTransaction));
            emit("op", "abort", "outcome", Txn.outcome(producer::abortTransaction));
        }
        reads(kit, "after", tps);
    }

    static TransactionDescription describe(Admin admin, String id) throws Exception {
        return admin.describeTransactions(List.of(id)).description(id).get(60, TimeUnit.SECONDS);
    }
}

package javatxn;

import static javaclient.Kit.emit;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;

import javaclient.Kit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListTransactionsOptions;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.admin.TransactionState;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;

/**
 * The Admin client's transaction calls (KIP-664), one scenario:
 *
 *   admin --bootstrap B --topic T --group G --txn-id X
 *       a transaction writes 2 records to each of T's 2 partitions and
 *       offsets of G, and is left open: listTransactions (all, by state, by
 *       producer id), describeTransactions, describeProducers; the states
 *       describeTransactions shows until the commit completes; the same after
 *       it; describeTransactions of an unknown id
 */
public final class TxnAdminCheck {
    public static void main(String[] args) throws Exception {
        Kit kit = Kit.parse(args);
        if (!kit.command.equals("admin")) {
            throw new IllegalArgumentException("unknown command " + kit.command);
        }
        String topic = kit.get("topic");
        String id = kit.get("txn-id");
        Txn.createTopics(kit, Map.of(topic, 2));
        List<TopicPartition> tps = Txn.partitions(topic, 2);
        try (Admin admin = Admin.create(kit.admin());
             var producer = Txn.producer(kit, id, 45000)) {
            producer.initTransactions();
            long before = System.currentTimeMillis();
            producer.beginTransaction();
            for (int i = 0; i < 4; i++) {
                producer.send(new ProducerRecord<>(topic, i % 2, null, Kit.bytes("r" + i)));
            }
            producer.sendOffsetsToTransaction(
                    Txn.commitAt(Map.of(new TopicPartition(topic, 0), 1L)),
                    new ConsumerGroupMetadata(kit.get("group")));
            producer.flush();
            long after = System.currentTimeMillis();
            emit("op", "open", "window", List.of(before, after));
            state(admin, id, tps, "open");
            producer.commitTransaction();
            // Kafka answers EndTxn once PrepareCommit is logged and writes the
            // markers after: the states a describer sees until it completes.
            List<Object> seen = new ArrayList<>();
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            for (String now = ""; seen.isEmpty() || now.startsWith("Prepare"); Thread.sleep(50)) {
                now = TxnCheck.describe(admin, id).state().toString();
                if (seen.isEmpty() || !seen.get(seen.size() - 1).equals(now)) {
                    seen.add(now);
                }
                Txn.check(deadline, "the commit to complete");
            }
            emit("op", "settle", "states", seen);
            state(admin, id, tps, "committed");
            emit("op", "unknown", "outcome", Txn.outcome(() ->
                    admin.describeTransactions(List.of(id + "-unknown")).all()
                            .get(60, TimeUnit.SECONDS)));
        }
    }

    private static void state(Admin admin, String id, List<TopicPartition> tps, String when)
            throws Exception {
        TransactionDescription d = admin.describeTransactions(List.of(id)).description(id)
                .get(60, TimeUnit.SECONDS);
        List<Object> parts = new ArrayList<>();
        d.topicPartitions().stream()
                .sorted(Comparator.comparing(TopicPartition::topic)
                        .thenComparing(TopicPartition::partition))
                .forEach(tp -> parts.add(Txn.name(tp)));
        emit("op", "describe_" + when, "coordinator", d.coordinatorId(),
                "state", d.state().toString(), "producer_id", d.producerId(),
                "epoch", d.producerEpoch(), "timeout_ms", d.transactionTimeoutMs(),
                "start_ms", d.transactionStartTimeMs().isPresent()
                        ? d.transactionStartTimeMs().getAsLong() : null,
                "partitions", parts);
        long pid = d.producerId();

        List<Object> all = listings(admin.listTransactions().all().get(60, TimeUnit.SECONDS), id);
        List<Object> inState = listings(admin.listTransactions(new ListTransactionsOptions()
                .filterStates(Set.of(d.state()))).all().get(60, TimeUnit.SECONDS), id);
        TransactionState other = d.state() == TransactionState.ONGOING
                ? TransactionState.COMPLETE_COMMIT : TransactionState.ONGOING;
        List<Object> inOther = listings(admin.listTransactions(new ListTransactionsOptions()
                .filterStates(Set.of(other))).all().get(60, TimeUnit.SECONDS), id);
        List<Object> byProducer = listings(admin.listTransactions(new ListTransactionsOptions()
                .filterProducerIds(Set.of(pid))).all().get(60, TimeUnit.SECONDS), null);
        emit("op", "list_" + when, "all", all, "in_state", inState, "in_other_state", inOther,
                "by_producer", byProducer);

        Map<String, Object> producers = new TreeMap<>();
        admin.describeProducers(tps).all().get(60, TimeUnit.SECONDS).forEach((tp, state) -> {
            List<Object> rows = new ArrayList<>();
            for (ProducerState p : state.activeProducers()) {
                rows.add(Kit.map("producer_id", p.producerId(), "epoch", p.producerEpoch(),
                        "last_sequence", p.lastSequence(), "last_timestamp", p.lastTimestamp(),
                        "coordinator_epoch", p.coordinatorEpoch().isPresent()
                                ? p.coordinatorEpoch().getAsInt() : null,
                        "txn_start_offset", p.currentTransactionStartOffset().isPresent()
                                ? p.currentTransactionStartOffset().getAsLong() : null));
            }
            producers.put(Txn.name(tp), rows);
        });
        emit("op", "producers_" + when, "producer_id", pid, "partitions", producers);
    }

    /** The listings of ``id`` (every listing when null) as [id, producer id, state]. */
    private static List<Object> listings(java.util.Collection<TransactionListing> found,
                                         String id) {
        List<Object> out = new ArrayList<>();
        found.stream().filter(l -> id == null || l.transactionalId().equals(id))
                .sorted(Comparator.comparing(TransactionListing::transactionalId))
                .forEach(l -> out.add(List.of(l.transactionalId(), l.producerId(),
                        l.state().toString())));
        return out;
    }
}

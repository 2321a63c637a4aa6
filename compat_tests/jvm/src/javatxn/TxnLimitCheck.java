package javatxn;

import static javaclient.Kit.emit;

import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import javaclient.Kit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.producer.ProducerRecord;

/**
 * A transaction whose batches a broker refuses for a limit on what an open
 * transaction may store (the gateway's gateway.txn.max.bytes), with the Java
 * producer:
 *
 *   over-limit --bootstrap B --topic T --txn-id X --size N --sends K
 *       one transaction sends K records of N bytes to partition 0, each send
 *       waited for (one batch each); prints how many were acknowledged and
 *       the first send's error; what commitTransaction() then throws; then
 *       abortTransaction(), a next transaction of one record "next" and its
 *       commit, and the producer's epoch before and after the abort
 *       (DescribeTransactions)
 */
public final class TxnLimitCheck {
    public static void main(String[] args) throws Exception {
        Kit kit = Kit.parse(args);
        if (!kit.command.equals("over-limit")) {
            throw new IllegalArgumentException("unknown command " + kit.command);
        }
        String topic = kit.get("topic");
        String id = kit.get("txn-id");
        int size = kit.integer("size", 10000);
        int sends = kit.integer("sends", 4);
        Txn.createTopics(kit, Map.of(topic, 1));
        byte[] value = new byte[size];
        Arrays.fill(value, (byte) 'v');
        try (var producer = Txn.producer(kit, id); Admin admin = Admin.create(kit.admin())) {
            producer.initTransactions();
            int epoch = TxnCheck.describe(admin, id).producerEpoch();
            producer.beginTransaction();
            int ok = 0;
            Object failed = null;
            for (int i = 0; i < sends && failed == null; i++) {
                try {
                    producer.send(new ProducerRecord<>(topic, 0, null, value))
                            .get(60, TimeUnit.SECONDS);
                    ok++;
                } catch (Exception e) {
                    failed = Kit.error(e);
                }
            }
            @SuppressWarnings("unchecked")
            Map<String, Object> error = failed == null ? Map.of("error", "none")
                    : (Map<String, Object>) failed;
            emit("op", "sent", "ok", ok, "error", error.get("error"),
                    "message", error.get("message"));
            emit("op", "commit", "outcome", Txn.outcome(producer::commitTransaction));
            emit("op", "abort", "outcome", Txn.outcome(producer::abortTransaction));
            int after = TxnCheck.describe(admin, id).producerEpoch();
            producer.beginTransaction();
            var next = producer.send(new ProducerRecord<>(topic, 0, null, Kit.bytes("next")));
            Object committed = Txn.outcome(producer::commitTransaction);
            emit("op", "after-abort", "epoch_before", epoch, "epoch_after", after,
                    "commit", committed, "acks", Txn.acks(List.of(next)));
        }
    }
}

package javatxn;

import static javaclient.Kit.emit;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;

import javaclient.Kit;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;

/**
 * An important consumer group whose offsets are committed in transactions
 * (consume, transform, produce with sendOffsetsToTransaction and the member's
 * group metadata), for compat_tests/test_important_consumers.py:
 *
 *   process --bootstrap B --topic T --group G --txn-id X --count N [--abort-to E]
 *       a member of G (read_committed, assigned T's one partition) reads from
 *       G's committed offset (the earliest where it has none) and processes N
 *       records: each poll's records are copied to T-out in one transaction
 *       that also commits the next offset for G. With --abort-to, one more
 *       transaction then sends offset E for G and aborts. Prints
 *       {"op":"processed","first":F,"next":O} (F: the first offset read), and
 *       {"op":"aborted","offset":E}.
 */
public final class ImportantCheck {
    public static void main(String[] args) throws Exception {
        Kit kit = Kit.parse(args);
        if (!kit.command.equals("process")) {
            throw new IllegalArgumentException("unknown command " + kit.command);
        }
        String topic = kit.get("topic");
        int count = kit.integer("count", 1);
        TopicPartition tp = new TopicPartition(topic, 0);
        try (var consumer = OffsetsCheck.member(kit, List.of(tp));
             var producer = Txn.producer(kit, kit.get("txn-id"))) {
            producer.initTransactions();
            // Joining polled, and may have fetched records already: start over
            // from the group's committed offset (the log start without one).
            var committed = consumer.committed(Set.of(tp), Kit.TIMEOUT).get(tp);
            if (committed == null) {
                consumer.seekToBeginning(List.of(tp));
            } else {
                consumer.seek(tp, committed.offset());
            }
            long first = -1;
            long next = consumer.position(tp, Kit.TIMEOUT);
            int processed = 0;
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            while (processed < count) {
                Txn.check(deadline, count + " records of " + tp);
                var records = consumer.poll(Duration.ofMillis(100));
                if (records.isEmpty()) {
                    continue;
                }
                producer.beginTransaction();
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    if (processed == count) {
                        break;
                    }
                    if (first < 0) {
                        first = r.offset();
                    }
                    producer.send(new ProducerRecord<>(topic + "-out", 0, null,
                            Kit.bytes("processed " + Kit.text(r.value()))));
                    next = r.offset() + 1;
                    processed++;
                }
                producer.sendOffsetsToTransaction(Txn.commitAt(Map.of(tp, next)),
                        consumer.groupMetadata());
                producer.commitTransaction();
            }
            emit("op", "processed", "first", first, "next", next);
            String abortTo = kit.get("abort-to", null);
            if (abortTo != null) {
                producer.beginTransaction();
                producer.sendOffsetsToTransaction(
                        Txn.commitAt(Map.of(tp, Long.parseLong(abortTo))),
                        consumer.groupMetadata());
                producer.abortTransaction();
                emit("op", "aborted", "offset", Long.parseLong(abortTo));
            }
        }
    }
}

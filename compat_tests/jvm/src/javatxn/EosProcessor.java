package javatxn;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeSet;

import javaclient.Kit;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.OutOfOrderSequenceException;
import org.apache.kafka.common.errors.ProducerFencedException;

/**
 * One instance of Kafka's own EOS v2 example (ExactlyOnceMessageProcessor,
 * kafka/examples, 3.4), for compat_tests/test_txn_eos_idle.py:
 *
 *   run --bootstrap B --group G --txn-id ID --source S --target T [--auto-commit true]
 *
 * One transactional id per instance. Each non-empty poll: beginTransaction,
 * send every record's value to T partition 0, sendOffsetsToTransaction with
 * position() of EVERY assigned partition (idle ones too: their committed
 * offset) and groupMetadata() (KIP-447), commitTransaction. A KafkaException
 * that is not fatal aborts and rewinds the consumer to the committed offsets,
 * as the example does. --auto-commit true leaves enable.auto.commit on (every
 * 100 ms): the user error the gateway must survive without losing records.
 *
 * JSON lines on stdout: "assigned" (the whole assignment) after each
 * rebalance, "committed"/"aborted" per transaction, "done" at the end. "stop"
 * on stdin ends the loop; the consumer then leaves the group.
 */
public final class EosProcessor {
    private final KafkaConsumer<byte[], byte[]> consumer;
    private final KafkaProducer<byte[], byte[]> producer;
    private final String source;
    private final String target;
    private volatile boolean running = true;

    public static void main(String[] args) throws Exception {
        Kit kit = Kit.parse(args);
        if (!kit.command.equals("run")) {
            throw new IllegalArgumentException("unknown command " + kit.command);
        }
        new EosProcessor(kit).run();
    }

    EosProcessor(Kit kit) {
        source = kit.get("source");
        target = kit.get("target");
        String transactionalId = kit.get("txn-id");
        boolean autoCommit = Boolean.parseBoolean(kit.get("auto-commit", "false"));
        Properties props = Txn.consumer(kit, kit.get("group"), TxnCheck.COMMITTED);
        props.put("client.id", transactionalId);
        props.put("session.timeout.ms", "6000");
        props.put("heartbeat.interval.ms", "500");
        props.put("max.poll.records", "100");
        props.put("enable.auto.commit", String.valueOf(autoCommit));
        props.put("auto.commit.interval.ms", "100");
        props.put("partition.assignment.strategy",
                "org.apache.kafka.clients.consumer.RangeAssignor");
        consumer = new KafkaConsumer<>(props);
        producer = Txn.producer(kit, transactionalId, 30000);
    }

    void run() throws Exception {
        Thread stdin = new Thread(() -> {
            try {
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))
                        .readLine();
            } catch (Exception e) {
                // stop anyway
            }
            running = false;
        });
        stdin.setDaemon(true);
        stdin.start();
        producer.initTransactions();
        consumer.subscribe(List.of(source), new ConsumerRebalanceListener() {
            @Override
            public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            }

            @Override
            public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                Kit.emit("op", "assigned", "partitions", partitionsOf(consumer.assignment()));
            }
        });
        int commits = 0;
        int aborts = 0;
        long total = 0;
        while (running) {
            ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(200));
            if (records.isEmpty()) {
                continue;
            }
            try {
                producer.beginTransaction();
                for (ConsumerRecord<byte[], byte[]> record : records) {
                    producer.send(new ProducerRecord<>(target, 0, null, record.value()));
                }
                producer.sendOffsetsToTransaction(consumerOffsets(), consumer.groupMetadata());
                producer.commitTransaction();
            } catch (ProducerFencedException | OutOfOrderSequenceException
                     | AuthorizationException e) {
                throw e;  // fatal: the example gives up too
            } catch (KafkaException e) {
                producer.abortTransaction();
                aborts++;
                Kit.emit("op", "aborted", "error", Kit.error(e));
                resetToLastCommittedPositions();
                continue;
            }
            commits++;
            total += records.count();
            Kit.emit("op", "committed", "records", records.count(), "total", total);
        }
        consumer.close();
        producer.close();
        Kit.emit("op", "done", "commits", commits, "aborts", aborts, "total", total);
    }

    /** The position of every assigned partition, as the example sends them. */
    private Map<TopicPartition, OffsetAndMetadata> consumerOffsets() {
        Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
        for (TopicPartition tp : consumer.assignment()) {
            offsets.put(tp, new OffsetAndMetadata(consumer.position(tp), null));
        }
        return offsets;
    }

    private void resetToLastCommittedPositions() {
        Map<TopicPartition, OffsetAndMetadata> committed =
                consumer.committed(consumer.assignment());
        consumer.assignment().forEach(tp -> {
            OffsetAndMetadata offset = committed.get(tp);
            if (offset != null) {
                consumer.seek(tp, offset.offset());
            } else {
                consumer.seekToBeginning(List.of(tp));
            }
        });
    }

    private static List<Object> partitionsOf(Collection<TopicPartition> tps) {
        TreeSet<Integer> sorted = new TreeSet<>();
        tps.forEach(tp -> sorted.add(tp.partition()));
        return new ArrayList<>(sorted);
    }
}

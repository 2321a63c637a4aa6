package javatxn;

import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.zip.CRC32;

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
import org.apache.kafka.common.errors.WakeupException;

/**
 * The exactly-once resharding worker of compat_tests/reshard_chaos.py with the
 * Java client (the confluent-kafka one is reshard_worker.py), so the chaos
 * check can SIGKILL it, SIGSTOP it past its session timeout (a zombie), and
 * kill the gateway under it:
 *
 *   run --bootstrap B --group G --source S --target T --target-partitions N --worker W
 *
 * The standard KIP-447 loop: poll the source (read_committed), begin a
 * transaction, send each record to the target partition of its user
 * (zlib.crc32 of the user id mod N, as the Python worker routes:
 * java.util.zip.CRC32 is the same function), sendOffsetsToTransaction with
 * the consumer's groupMetadata(), commit. A fatal error (fenced, out of order
 * sequence, authorization; thrown as is or as the cause of a KafkaException)
 * closes the producer and makes a new one; any other KafkaException aborts
 * the transaction. Either way the consumer is rewound to the committed
 * offsets, so what the lost transaction consumed
 * is read again. One plain-text line per outcome on stdout (the check counts
 * the lines starting with "abort" and "fatal"); SIGTERM stops the loop.
 *
 * Source values are "u<user> seq=<n>"; target values are
 * "<source partition>:<source offset>:u<user> seq=<n>".
 */
public final class ReshardWorker {
    private static final PrintStream OUT =
            new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);

    private final Kit kit;
    private final String source;
    private final String target;
    private final int partitions;
    private final String transactionalId;
    private final KafkaConsumer<byte[], byte[]> consumer;
    private KafkaProducer<byte[], byte[]> producer;
    private volatile boolean running = true;

    public static void main(String[] args) {
        Kit kit = Kit.parse(args);
        if (!kit.command.equals("run")) {
            throw new IllegalArgumentException("unknown command " + kit.command);
        }
        new ReshardWorker(kit).run();
    }

    static void log(String line) {
        OUT.println(line);
    }

    static int route(byte[] value, int partitions) {
        int space = 0;
        while (space < value.length && value[space] != ' ') {
            space++;
        }
        CRC32 crc = new CRC32();
        crc.update(value, 0, space);
        return (int) (crc.getValue() % partitions);
    }

    ReshardWorker(Kit kit) {
        this.kit = kit;
        this.source = kit.get("source");
        this.target = kit.get("target");
        this.partitions = Integer.parseInt(kit.get("target-partitions"));
        this.transactionalId = "reshard-" + kit.get("worker");
        Properties props = Txn.consumer(kit, kit.get("group"), TxnCheck.COMMITTED);
        props.put("client.id", transactionalId);
        props.put("session.timeout.ms", "6000");
        props.put("heartbeat.interval.ms", "500");
        props.put("max.poll.records", "200");
        props.put("partition.assignment.strategy",
                "org.apache.kafka.clients.consumer.RangeAssignor");
        consumer = new KafkaConsumer<>(props);
    }

    private KafkaProducer<byte[], byte[]> newProducer() {
        Properties props = kit.producer();
        props.put("transactional.id", transactionalId);
        props.put("transaction.timeout.ms", "30000");
        props.put("request.timeout.ms", "15000");
        props.put("delivery.timeout.ms", "20000");
        props.put("linger.ms", "5");
        var made = new KafkaProducer<byte[], byte[]>(props);
        try {
            made.initTransactions();
        } catch (KafkaException e) {
            made.close(Duration.ZERO);
            throw e;
        }
        return made;
    }

    /** Close the producer (if any) and make a new one, until one is made or SIGTERM. */
    private void replaceProducer() {
        if (producer != null) {
            producer.close(Duration.ZERO);
            producer = null;
        }
        while (running && producer == null) {
            try {
                producer = newProducer();
            } catch (KafkaException e) {
                log("new producer failed " + name(e));
            }
        }
    }

    void run() {
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            running = false;
            consumer.wakeup();
            try {
                main.join(15000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));
        consumer.subscribe(List.of(source), new ConsumerRebalanceListener() {
            @Override
            public void onPartitionsAssigned(Collection<TopicPartition> tps) {
                log("assigned " + String.join(",", tps.stream().map(tp ->
                        String.valueOf(tp.partition())).sorted().toList()));
            }

            @Override
            public void onPartitionsRevoked(Collection<TopicPartition> tps) {
            }
        });
        try {
            replaceProducer();
            while (running) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(500));
                if (!records.isEmpty()) {
                    transact(records);
                }
            }
        } catch (WakeupException stopping) {
            // SIGTERM
        } finally {
            consumer.close(Duration.ofSeconds(5));
            if (producer != null) {
                producer.close(Duration.ofSeconds(5));
            }
        }
    }

    private void transact(ConsumerRecords<byte[], byte[]> records) {
        Map<Integer, String> range = new TreeMap<>();  // partition -> "first-last", for the log
        for (TopicPartition tp : records.partitions()) {
            var rs = records.records(tp);
            range.put(tp.partition(), rs.get(0).offset() + "-" + rs.get(rs.size() - 1).offset());
        }
        try {
            producer.beginTransaction();
            Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
            for (ConsumerRecord<byte[], byte[]> r : records) {
                byte[] prefix = (r.partition() + ":" + r.offset() + ":")
                        .getBytes(StandardCharsets.UTF_8);
                byte[] value = new byte[prefix.length + r.value().length];
                System.arraycopy(prefix, 0, value, 0, prefix.length);
                System.arraycopy(r.value(), 0, value, prefix.length, r.value().length);
                producer.send(new ProducerRecord<>(target, route(r.value(), partitions), null,
                        value));
                next.put(new TopicPartition(r.topic(), r.partition()),
                        new OffsetAndMetadata(r.offset() + 1));
            }
            producer.sendOffsetsToTransaction(next, consumer.groupMetadata());
            producer.commitTransaction();
            Map<Integer, Long> shown = new TreeMap<>();
            next.forEach((tp, om) -> shown.put(tp.partition(), om.offset()));
            log("committed " + records.count() + " " + shown);
        } catch (KafkaException e) {
            if (fatal(e)) {
                log("fatal " + name(e) + " - new producer; lost " + range);
                replaceProducer();
            } else {
                log("abort " + name(e) + " " + range);
                try {
                    producer.abortTransaction();
                } catch (KafkaException again) {
                    log("abort failed " + name(again) + " - new producer");
                    replaceProducer();
                }
            }
            rewind();
        }
    }

    /** An error this producer cannot go on after, thrown as is or as the cause of a
     *  KafkaException (commitTransaction() wraps the error of a failed send). */
    static boolean fatal(KafkaException e) {
        for (Throwable t : new Throwable[] {e, e.getCause()}) {
            if (t instanceof ProducerFencedException || t instanceof OutOfOrderSequenceException
                    || t instanceof AuthorizationException) {
                return true;
            }
        }
        return false;
    }

    /** The class of an error and of its cause, if it has one. */
    static String name(Throwable t) {
        String out = t.getClass().getSimpleName();
        return t.getCause() == null ? out : out + "(" + t.getCause().getClass().getSimpleName() + ")";
    }

    /**
     * Back to the committed offsets: what the lost transaction consumed is
     * read again. Until that succeeds nothing else may be consumed, or the
     * next transaction would commit past records nobody wrote.
     */
    private void rewind() {
        while (running) {
            Set<TopicPartition> assigned = consumer.assignment();
            try {
                Map<TopicPartition, OffsetAndMetadata> committed =
                        consumer.committed(assigned, Duration.ofSeconds(20));
                List<TopicPartition> fromStart = new ArrayList<>();
                for (TopicPartition tp : assigned) {
                    OffsetAndMetadata om = committed.get(tp);
                    if (om == null) {
                        fromStart.add(tp);
                    } else {
                        consumer.seek(tp, om.offset());
                    }
                }
                if (!fromStart.isEmpty()) {  // none would mean every assigned partition
                    consumer.seekToBeginning(fromStart);
                }
                Map<Integer, Object> shown = new TreeMap<>();
                assigned.forEach(tp -> shown.put(tp.partition(),
                        committed.get(tp) == null ? "start" : committed.get(tp).offset()));
                log("rewound " + shown);
                return;
            } catch (WakeupException stopping) {
                throw stopping;
            } catch (KafkaException e) {
                log("rewind failed " + name(e));
            }
        }
    }
}

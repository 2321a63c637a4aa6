package javaclient;

import static javaclient.Kit.emit;
import static javaclient.Kit.error;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.internals.RecordHeader;

/**
 * The Java producer against a broker, one scenario per command:
 *
 *   records --bootstrap B --topic T --codec C --count N
 *       N records with keys, headers and every tenth value null; one line per ack
 *   batches --bootstrap B --topic T --codec C --sizes 10,10 --base-timestamp TS
 *       exactly one batch per size (linger held back, flush() between), record i
 *       stamped TS + 10 * i; one line per ack
 *   default --bootstrap B --topic T
 *       one record through a producer with the client's defaults; its outcome
 *   stream --bootstrap B --topic T --partitions P --max N
 *       records v0, v1, ... to partition i % P until stdin closes or says stop;
 *       one line per ack or failure, then a summary
 */
public final class ProduceCheck {
    public static void main(String[] args) throws Exception {
        Kit kit = Kit.parse(args);
        String topic = kit.get("topic");
        switch (kit.command) {
            case "records" -> records(kit, topic);
            case "batches" -> batches(kit, topic);
            case "default" -> defaults(kit, topic);
            case "stream" -> stream(kit, topic);
            default -> throw new IllegalArgumentException("unknown command " + kit.command);
        }
    }

    private static void records(Kit kit, String topic) throws Exception {
        Properties props = kit.producer();
        props.put("compression.type", kit.get("codec"));
        props.put("linger.ms", "5");
        int count = kit.integer("count", 300);
        try (var producer = new KafkaProducer<byte[], byte[]>(props)) {
            List<Future<RecordMetadata>> acks = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                String value = i % 10 == 0 ? null : ("value-" + i).repeat(20);
                var record = new ProducerRecord<>(topic, 0, Kit.bytes("k" + i), Kit.bytes(value),
                        List.of(new RecordHeader("index", Kit.bytes(String.valueOf(i))),
                                new RecordHeader("codec", Kit.bytes(kit.get("codec")))));
                acks.add(producer.send(record));
            }
            producer.flush();
            for (int i = 0; i < count; i++) {
                RecordMetadata m = acks.get(i).get(60, TimeUnit.SECONDS);
                emit("ack", i, "partition", m.partition(), "offset", m.offset());
            }
        }
    }

    private static void batches(Kit kit, String topic) throws Exception {
        List<Integer> sizes = new ArrayList<>();
        for (String size : kit.get("sizes").split(",")) {
            sizes.add(Integer.parseInt(size));
        }
        long base = Long.parseLong(kit.get("base-timestamp"));
        List<RecordMetadata> acks = sendBatches(kit, topic, kit.get("codec"), sizes,
                i -> base + 10L * i);
        for (int i = 0; i < acks.size(); i++) {
            emit("ack", i, "partition", acks.get(i).partition(), "offset", acks.get(i).offset());
        }
    }

    /** Record i's timestamp. */
    public interface Stamp {
        long of(int index);
    }

    /**
     * Values r0, r1, ... to partition 0 in exactly one batch per size: linger
     * holds records back and each flush() sends what was appended since.
     */
    public static List<RecordMetadata> sendBatches(Kit kit, String topic, String codec,
                                                   List<Integer> sizes, Stamp stamp)
            throws Exception {
        Properties props = kit.producer();
        props.put("compression.type", codec);
        props.put("linger.ms", "60000");
        props.put("batch.size", "1048576");
        List<Future<RecordMetadata>> futures = new ArrayList<>();
        try (var producer = new KafkaProducer<byte[], byte[]>(props)) {
            int index = 0;
            for (int size : sizes) {
                for (int end = index + size; index < end; index++) {
                    futures.add(producer.send(new ProducerRecord<>(topic, 0, stamp.of(index), null,
                            Kit.bytes("r" + index))));
                }
                producer.flush();
            }
            List<RecordMetadata> acks = new ArrayList<>();
            for (var future : futures) {
                acks.add(future.get(60, TimeUnit.SECONDS));
            }
            return acks;
        }
    }

    /**
     * The producer as the Java client configures it by default (idempotent,
     * acks=all), which needs InitProducerId. Only the delivery timeout is
     * shortened so a hang shows as a TimeoutException within the test's time.
     */
    private static void defaults(Kit kit, String topic) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", kit.bootstrap());
        props.put("key.serializer", "org.apache.kafka.common.serialization.ByteArraySerializer");
        props.put("value.serializer", "org.apache.kafka.common.serialization.ByteArraySerializer");
        props.put("delivery.timeout.ms", "30000");
        props.put("request.timeout.ms", "20000");
        try (var producer = new KafkaProducer<byte[], byte[]>(props)) {
            try {
                RecordMetadata m = producer.send(new ProducerRecord<>(topic, Kit.bytes("default")))
                        .get(60, TimeUnit.SECONDS);
                emit("op", "send", "ok", true, "offset", m.offset());
            } catch (Exception e) {
                Map<String, Object> out = Kit.map("op", "send", "ok", false);
                out.putAll(error(e));
                Kit.print(out);
            }
        }
    }

    /**
     * Produce until told to stop, counting what was acknowledged. The producer
     * is idempotent (the default) and retries: a batch whose first answer was
     * lost (the gateway killed after storing it) is retried and recognised as
     * a duplicate by the sequences the gateway stored with the data, so each
     * record is written exactly once.
     */
    private static void stream(Kit kit, String topic) throws Exception {
        Properties props = kit.producer();
        props.put("linger.ms", "2");
        props.put("request.timeout.ms", "5000");
        props.put("delivery.timeout.ms", "10000");
        props.put("reconnect.backoff.max.ms", "200");
        int partitions = kit.integer("partitions", 1);
        int max = kit.integer("max", 20000);
        AtomicBoolean stop = new AtomicBoolean();
        Thread stdin = new Thread(() -> {
            try (var in = new BufferedReader(new InputStreamReader(System.in,
                    StandardCharsets.UTF_8))) {
                String line;
                while ((line = in.readLine()) != null && !line.trim().equals("stop")) {
                    // anything else is ignored
                }
            } catch (Exception ignored) {
                // a closed stdin means stop too
            }
            stop.set(true);
        });
        stdin.setDaemon(true);
        stdin.start();
        AtomicInteger acked = new AtomicInteger();
        AtomicInteger failed = new AtomicInteger();
        int sent = 0;
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(kit.integer("seconds", 150));
        try (var producer = new KafkaProducer<byte[], byte[]>(props)) {
            for (; sent < max && !stop.get() && System.nanoTime() < deadline; sent++) {
                final int index = sent;
                producer.send(new ProducerRecord<>(topic, index % partitions, null,
                        Kit.bytes("v" + index)), (m, e) -> {
                    if (e == null) {
                        acked.incrementAndGet();
                        emit("ack", index, "partition", m.partition(), "offset", m.offset());
                    } else {
                        failed.incrementAndGet();
                        Map<String, Object> out = Kit.map("failed", index);
                        out.putAll(error(e));
                        Kit.print(out);
                    }
                });
                Thread.sleep(1);  // a steady stream, so the kill lands in the middle of it
            }
            producer.flush();
        }
        emit("op", "summary", "sent", sent, "acked", acked.get(), "failed", failed.get());
    }
}

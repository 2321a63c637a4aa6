package javatxn;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import javaclient.Kit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;

/**
 * What the transaction programs share: transactional producers, topics made
 * through the Admin client (so one program runs against the gateway and
 * against Apache Kafka alike), reading partitions to their end offsets at an
 * isolation level, and catching a client call's outcome as a JSON value.
 */
final class Txn {
    private Txn() {
    }

    /** A step that may throw: its outcome is printed, not propagated. */
    interface Step {
        void run() throws Exception;
    }

    /** A producer with the client's defaults plus a transactional id. */
    static KafkaProducer<byte[], byte[]> producer(Kit kit, String transactionalId,
                                                  int timeoutMs) {
        Properties props = kit.producer();
        props.put("transactional.id", transactionalId);
        props.put("transaction.timeout.ms", String.valueOf(timeoutMs));
        return new KafkaProducer<>(props);
    }

    static KafkaProducer<byte[], byte[]> producer(Kit kit, String transactionalId) {
        return producer(kit, transactionalId, 60000);
    }

    static void createTopics(Kit kit, Map<String, Integer> partitions) throws Exception {
        try (Admin admin = Admin.create(kit.admin())) {
            List<NewTopic> topics = new ArrayList<>();
            partitions.forEach((name, count) -> topics.add(new NewTopic(name, count, (short) 1)));
            admin.createTopics(topics).all().get(60, TimeUnit.SECONDS);
        }
    }

    static List<TopicPartition> partitions(String topic, int count) {
        List<TopicPartition> out = new ArrayList<>();
        for (int p = 0; p < count; p++) {
            out.add(new TopicPartition(topic, p));
        }
        return out;
    }

    /** "ok", or the error a step threw (Kit.error: class, message, causes). */
    static Object outcome(Step step) {
        try {
            step.run();
            return "ok";
        } catch (Exception e) {
            return Kit.error(e);
        }
    }

    /** [topic, partition, offset] of every ack, in send order; the send's error otherwise. */
    static List<Object> acks(List<Future<RecordMetadata>> futures) throws InterruptedException {
        List<Object> out = new ArrayList<>();
        for (Future<RecordMetadata> future : futures) {
            try {
                RecordMetadata m = future.get(60, TimeUnit.SECONDS);
                out.add(List.of(m.topic(), m.partition(), m.offset()));
            } catch (ExecutionException | java.util.concurrent.TimeoutException e) {
                out.add(Kit.error(e));
            }
        }
        return out;
    }

    static Properties consumer(Kit kit, String group, String isolation) {
        Properties props = kit.consumer(group);
        props.put("isolation.level", isolation);
        return props;
    }

    /** End offsets as a consumer at ``isolation`` sees them: {"topic/partition": offset}. */
    static Map<String, Object> endOffsets(Kit kit, List<TopicPartition> tps, String isolation) {
        try (var consumer = new KafkaConsumer<byte[], byte[]>(consumer(kit, null, isolation))) {
            Map<String, Object> out = new TreeMap<>();
            consumer.endOffsets(tps, Kit.TIMEOUT).forEach((tp, end) -> out.put(name(tp), end));
            return out;
        }
    }

    /**
     * Every record of ``tps`` from the beginning to the end offsets a consumer
     * at ``isolation`` sees, as [topic, partition, offset, value].
     */
    static List<Object> readAll(Kit kit, List<TopicPartition> tps, String isolation) {
        try (var consumer = new KafkaConsumer<byte[], byte[]>(consumer(kit, null, isolation))) {
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            Map<TopicPartition, Long> ends = consumer.endOffsets(tps, Kit.TIMEOUT);
            List<Object> out = new ArrayList<>();
            long deadline = System.nanoTime() + Kit.TIMEOUT.toNanos();
            while (tps.stream().anyMatch(tp -> consumer.position(tp) < ends.get(tp))) {
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("timed out reading to " + ends);
                }
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(100))) {
                    out.add(List.of(r.topic(), r.partition(), r.offset(), Kit.text(r.value())));
                }
            }
            return out;
        }
    }

    static String name(TopicPartition tp) {
        return tp.topic() + "/" + tp.partition();
    }

    /** {"topic/partition": offset} of committed offsets; null where none. */
    static Map<String, Object> offsets(Map<TopicPartition, OffsetAndMetadata> committed) {
        Map<String, Object> out = new TreeMap<>();
        committed.forEach((tp, om) -> out.put(name(tp), om == null ? null : om.offset()));
        return out;
    }

    static Map<TopicPartition, OffsetAndMetadata> commitAt(Map<TopicPartition, Long> offsets) {
        Map<TopicPartition, OffsetAndMetadata> out = new HashMap<>();
        offsets.forEach((tp, offset) -> out.put(tp, new OffsetAndMetadata(offset)));
        return out;
    }

    static void check(long deadline, String what) {
        if (System.nanoTime() > deadline) {
            throw new IllegalStateException("timed out waiting for " + what);
        }
    }
}

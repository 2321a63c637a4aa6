package javaclient;

import static javaclient.Kit.emit;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.RangeAssignor;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;

/**
 * The Java consumer as a group member (subscribe), one scenario per command:
 *
 *   split  --bootstrap B --topic T --group G --assignor A --partitions P --per-partition N
 *       member "a" joins alone, then "b" joins; once they split the partitions,
 *       N records per partition are produced and consumed: "a" commits with
 *       commitSync, "b" with commitAsync and a callback. Both close, and one
 *       more record per partition is produced for the next incarnation.
 *   resume --bootstrap B --topic T --group G --partitions P
 *       a new member of G: the committed offsets it reads back, then every
 *       record from there to the end offsets, committed with commitSync
 *   consumer-protocol --bootstrap B --topic T --group G
 *       a member with group.protocol=consumer (KIP-848, the 4.x client's
 *       new group protocol) subscribes and polls until the client throws, or
 *       for TIMEOUT; prints what it threw and how long that took
 */
public final class GroupCheck {
    public static void main(String[] args) throws Exception {
        Kit kit = Kit.parse(args);
        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < kit.integer("partitions", 1); p++) {
            tps.add(new TopicPartition(kit.get("topic"), p));
        }
        switch (kit.command) {
            case "split" -> split(kit, tps);
            case "resume" -> resume(kit, tps);
            case "consumer-protocol" -> consumerProtocol(kit);
            default -> throw new IllegalArgumentException("unknown command " + kit.command);
        }
    }

    static void consumerProtocol(Kit kit) {
        var props = kit.consumer(kit.get("group"));
        props.put("group.protocol", "consumer");  // a String: compiles on both lines
        long start = System.nanoTime();
        int polled = 0;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(kit.get("topic")));
            while (System.nanoTime() - start < Kit.TIMEOUT.toNanos()) {
                polled += consumer.poll(Duration.ofMillis(200)).count();
            }
            emit("op", "consumer_protocol", "ok", true, "polled", polled);
        } catch (Exception e) {
            Map<String, Object> out = Kit.map("op", "consumer_protocol", "ok", false,
                    "polled", polled,
                    "seconds", (System.nanoTime() - start) / 1_000_000_000.0);
            out.putAll(Kit.error(e));
            Kit.print(out);
        }
    }

    /** A group member that records its rebalance callbacks and what it consumed. */
    static final class Member implements ConsumerRebalanceListener {
        final String name;
        final KafkaConsumer<byte[], byte[]> consumer;
        final List<Object> events = new ArrayList<>();
        final List<Object> consumed = new ArrayList<>();

        Member(Kit kit, String name, String assignor) {
            this.name = name;
            var props = kit.consumer(kit.get("group"));
            props.put("client.id", name);  // member ids start with it: range orders by them
            props.put("partition.assignment.strategy", switch (assignor) {
                case "range" -> RangeAssignor.class.getName();
                case "cooperative-sticky" -> CooperativeStickyAssignor.class.getName();
                default -> throw new IllegalArgumentException("unknown assignor " + assignor);
            });
            props.put("session.timeout.ms", "10000");
            props.put("heartbeat.interval.ms", "500");
            consumer = new KafkaConsumer<>(props);
            consumer.subscribe(List.of(kit.get("topic")), this);
        }

        int poll() {
            int count = 0;
            for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(100))) {
                consumed.add(List.of(r.partition(), r.offset(), Kit.text(r.value())));
                count++;
            }
            return count;
        }

        Set<Integer> held() {
            Set<Integer> out = new HashSet<>();
            consumer.assignment().forEach(tp -> out.add(tp.partition()));
            return out;
        }

        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            events.add(List.of("assigned", sorted(partitions)));
        }

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            events.add(List.of("revoked", sorted(partitions)));
        }
    }

    static List<Integer> sorted(Collection<TopicPartition> partitions) {
        return partitions.stream().map(TopicPartition::partition).sorted().toList();
    }

    private static void split(Kit kit, List<TopicPartition> tps) throws Exception {
        String assignor = kit.get("assignor");
        int perPartition = kit.integer("per-partition", 10);
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(120);
        Member a = new Member(kit, "a", assignor);
        while (a.held().size() < tps.size()) {
            check(deadline, "member a to hold every partition");
            a.poll();
        }
        Member b = new Member(kit, "b", assignor);
        while (a.held().size() + b.held().size() != tps.size() || a.held().isEmpty()
                || b.held().isEmpty() || !disjoint(a.held(), b.held())) {
            check(deadline, "members a and b to split the partitions");
            a.poll();
            b.poll();
        }
        emit("op", "split", "a", a.held().stream().sorted().toList(),
                "b", b.held().stream().sorted().toList());

        try (var producer = new KafkaProducer<byte[], byte[]>(kit.producer())) {
            for (int i = 0; i < perPartition * tps.size(); i++) {
                producer.send(new ProducerRecord<>(tps.get(0).topic(), i % tps.size(), null,
                        Kit.bytes("v" + i)));
            }
            producer.flush();
        }
        int asyncSent = 0;
        int[] asyncDone = {0};
        List<Object> asyncErrors = new ArrayList<>();
        while (a.consumed.size() + b.consumed.size() < perPartition * tps.size()
                || asyncDone[0] < asyncSent) {
            check(deadline, "every record consumed and every async commit answered");
            if (a.poll() > 0) {
                a.consumer.commitSync();
            }
            if (b.poll() > 0) {
                asyncSent++;
                b.consumer.commitAsync((offsets, e) -> {
                    asyncDone[0]++;  // callbacks run inside poll(), on this thread
                    if (e != null) {
                        asyncErrors.add(Kit.error(e));
                    }
                });
            }
        }
        emit("op", "commit_async", "sent", asyncSent, "completed", asyncDone[0],
                "errors", asyncErrors);
        for (Member m : List.of(a, b)) {
            emit("op", "member", "name", m.name, "events", m.events, "consumed", m.consumed,
                    "held", m.held().stream().sorted().toList());
            m.consumer.close();
        }
        try (var producer = new KafkaProducer<byte[], byte[]>(kit.producer())) {
            for (TopicPartition tp : tps) {
                producer.send(new ProducerRecord<>(tp.topic(), tp.partition(), null,
                        Kit.bytes("late-" + tp.partition())));
            }
            producer.flush();
        }
    }

    private static void resume(Kit kit, List<TopicPartition> tps) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(120);
        Member c = new Member(kit, "c", "range");
        Map<String, Object> committed = new TreeMap<>();
        c.consumer.committed(new HashSet<>(tps), Duration.ofSeconds(60)).forEach((tp, om) ->
                committed.put(String.valueOf(tp.partition()),
                        om == null ? null : List.of(om.offset(), om.metadata())));
        emit("op", "committed", "offsets", committed);
        while (c.held().size() < tps.size()) {
            check(deadline, "member c to hold every partition");
            c.poll();
        }
        Map<TopicPartition, Long> ends = c.consumer.endOffsets(tps);
        while (tps.stream().anyMatch(tp -> c.consumer.position(tp) < ends.get(tp))) {
            check(deadline, "member c to reach the end offsets " + ends);
            c.poll();
        }
        c.consumer.commitSync();
        emit("op", "member", "name", c.name, "events", c.events, "consumed", c.consumed,
                "held", c.held().stream().sorted().toList());
        c.consumer.close();
    }

    private static boolean disjoint(Set<Integer> x, Set<Integer> y) {
        Set<Integer> both = new HashSet<>(x);
        both.retainAll(y);
        return both.isEmpty();
    }

    private static void check(long deadline, String what) {
        if (System.nanoTime() > deadline) {
            throw new IllegalStateException("timed out waiting for " + what);
        }
    }
}

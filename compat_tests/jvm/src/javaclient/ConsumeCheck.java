package javaclient;

import static javaclient.Kit.emit;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.common.TopicPartition;

/**
 * The Java consumer with assign()/seek() (no group), one scenario per command:
 *
 *   dump --bootstrap B --topic T --partitions P
 *       every record of partitions 0..P-1 from the beginning to the end offsets
 *   seek --bootstrap B --topic T --base-timestamp TS
 *       seek, seekToBeginning, seekToEnd and offsetsForTimes on partition 0,
 *       whose record i is stamped TS + 10 * i (ProduceCheck batches)
 */
public final class ConsumeCheck {
    public static void main(String[] args) throws Exception {
        Kit kit = Kit.parse(args);
        String topic = kit.get("topic");
        switch (kit.command) {
            case "dump" -> dump(kit, topic, kit.integer("partitions", 1));
            case "seek" -> seek(kit, topic, Long.parseLong(kit.get("base-timestamp")));
            default -> throw new IllegalArgumentException("unknown command " + kit.command);
        }
    }

    private static void dump(Kit kit, String topic, int partitions) {
        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < partitions; p++) {
            tps.add(new TopicPartition(topic, p));
        }
        try (var consumer = new KafkaConsumer<byte[], byte[]>(kit.consumer(null))) {
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            Map<TopicPartition, Long> ends = consumer.endOffsets(tps);
            Map<TopicPartition, Long> starts = consumer.beginningOffsets(tps);
            for (TopicPartition tp : tps) {
                emit("op", "watermarks", "partition", tp.partition(), "start", starts.get(tp),
                        "end", ends.get(tp));
            }
            for (var r : readTo(consumer, ends)) {
                Kit.print(Kit.record(r));
            }
        }
    }

    /** Poll until every partition's position reaches its end offset (bounded). */
    static List<ConsumerRecord<byte[], byte[]>> readTo(KafkaConsumer<byte[], byte[]> consumer,
                                                       Map<TopicPartition, Long> ends) {
        List<ConsumerRecord<byte[], byte[]>> out = new ArrayList<>();
        long deadline = System.nanoTime() + Kit.TIMEOUT.toNanos();
        while (ends.entrySet().stream().anyMatch(e -> consumer.position(e.getKey()) < e.getValue())) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("not at the end offsets " + ends + " after "
                        + Kit.TIMEOUT + "; read " + out.size());
            }
            consumer.poll(Duration.ofMillis(200)).forEach(out::add);
        }
        return out;
    }

    /** The offsets of the records the next polls return, up to the end offset. */
    private static List<Long> offsetsFrom(KafkaConsumer<byte[], byte[]> consumer,
                                          TopicPartition tp, long end) {
        List<Long> out = new ArrayList<>();
        for (var r : readTo(consumer, Map.of(tp, end))) {
            out.add(r.offset());
        }
        return out;
    }

    private static void seek(Kit kit, String topic, long base) {
        TopicPartition tp = new TopicPartition(topic, 0);
        for (String isolation : List.of("read_uncommitted", "read_committed")) {
            var props = kit.consumer(null);
            props.put("isolation.level", isolation);
            props.put("max.poll.records", "3");  // positions advance inside a batch too
            try (var consumer = new KafkaConsumer<byte[], byte[]>(props)) {
                consumer.assign(List.of(tp));
                long end = consumer.endOffsets(List.of(tp)).get(tp);
                emit("op", "bounds", "isolation", isolation,
                        "beginning", consumer.beginningOffsets(List.of(tp)).get(tp), "end", end);
                for (long offset : new long[] {5, 13, 10, 19, 0}) {
                    consumer.seek(tp, offset);
                    emit("op", "seek", "isolation", isolation, "to", offset,
                            "read", offsetsFrom(consumer, tp, end));
                }
                consumer.seekToBeginning(List.of(tp));
                emit("op", "seek_to_beginning", "isolation", isolation,
                        "position", consumer.position(tp), "read", offsetsFrom(consumer, tp, end));
                consumer.seekToEnd(List.of(tp));
                long position = consumer.position(tp, Duration.ofSeconds(60));
                emit("op", "seek_to_end", "isolation", isolation, "position", position,
                        "polled", consumer.poll(Duration.ofMillis(500)).count());
                for (long ts : new long[] {-1, 40, 45, 185, 1000}) {  // relative to base
                    OffsetAndTimestamp found = consumer.offsetsForTimes(Map.of(tp, base + ts),
                            Duration.ofSeconds(60)).get(tp);
                    List<Long> read = List.of();
                    if (found != null) {
                        consumer.seek(tp, found.offset());
                        read = offsetsFrom(consumer, tp, end);
                    }
                    emit("op", "offsets_for_times", "isolation", isolation, "ts", ts,
                            "offset", found == null ? null : found.offset(),
                            "timestamp", found == null ? null : found.timestamp() - base,
                            "read", read);
                }
            }
        }
    }
}

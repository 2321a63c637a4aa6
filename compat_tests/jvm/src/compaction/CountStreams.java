package compaction;

import static javaclient.Kit.emit;

import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import javaclient.Kit;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.log4j.AppenderSkeleton;
import org.apache.log4j.Level;
import org.apache.log4j.Logger;
import org.apache.log4j.spi.LoggingEvent;

/**
 * A stateful Kafka Streams 3.4.1 app with processing.guarantee=exactly_once_v2:
 * input (key: a record id, value: a user) -> groupBy(user), through the
 * repartition topic APP-by-user-repartition -> count() into the store
 * "counts", whose changelog APP-counts-changelog is a compacted topic ->
 * output (user -> count). Commands:
 *
 *   produce --bootstrap B --input T --users U --from F --count N --base-ms MS
 *       [--batch-size BYTES]
 *       records r-n -> "user-(n % U)" for n in [F, F + N), stamped MS + 10 n,
 *       in batches of at most BYTES (batch.size) if given
 *   run --bootstrap B --app-id A --input T --output O --state-dir D [--delay-ms MS]
 *       [--topic-config NAME=VALUE] [--main-consumer-config NAME=VALUE]
 *       the app, until stdin says "stop" (or closes), NAME=VALUE set on its
 *       internal topics as "topic.NAME" (StreamsConfig.topicPrefix); the store caches
 *       nothing, so every count goes to the changelog, and the internal
 *       topics roll a segment every 200 ms of record time and are cleaned as
 *       soon as anything is dirty; --main-consumer-config NAME=VALUE is set
 *       on its main consumer (StreamsConfig.mainConsumerPrefix). Prints its
 *       state changes and, for each changelog partition it restores, how
 *       many records it read (each with the time, "ms"); at the end, how
 *       many sends were answered without an
 *       offset ("offset-warnings": RecordCollectorImpl's WARN "Received
 *       offset=-1 ...", one per record on the gateway: counted, not printed).
 *   dump --bootstrap B --output O --partitions P
 *       each user's last count in the output, as a read_committed consumer sees it
 */
public final class CountStreams {
    public static void main(String[] args) throws Exception {
        Kit kit = Kit.parse(args);
        switch (kit.command) {
            case "produce" -> produce(kit);
            case "run" -> run(kit);
            case "dump" -> dump(kit);
            default -> throw new IllegalArgumentException("unknown command " + kit.command);
        }
    }

    private static void produce(Kit kit) throws Exception {
        int users = kit.integer("users", 50);
        int from = kit.integer("from", 0);
        int count = kit.integer("count", 1000);
        long base = Long.parseLong(kit.get("base-ms"));
        var props = kit.producer();
        props.put("linger.ms", "5");
        String batchSize = kit.get("batch-size", "");
        if (!batchSize.isEmpty()) {
            props.put("batch.size", batchSize);
        }
        List<Future<RecordMetadata>> acks = new ArrayList<>();
        try (var producer = new KafkaProducer<byte[], byte[]>(props)) {
            for (int n = from; n < from + count; n++) {
                acks.add(producer.send(new ProducerRecord<>(kit.get("input"), null,
                        base + 10L * n, Kit.bytes("r-" + n), Kit.bytes("user-" + (n % users)))));
            }
            for (Future<RecordMetadata> ack : acks) {
                ack.get(60, TimeUnit.SECONDS);
            }
        }
        emit("op", "produced", "count", count);
    }

    static Topology topology(Kit kit) {
        int delayMs = kit.integer("delay-ms", 0);
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(kit.get("input"), Consumed.with(Serdes.String(), Serdes.String()))
                .peek((k, v) -> {
                    if (delayMs > 0) {
                        try {
                            Thread.sleep(delayMs);
                        } catch (InterruptedException e) {
                            Thread.currentThread().interrupt();
                        }
                    }
                })
                .groupBy((k, v) -> v, Grouped.with("by-user", Serdes.String(), Serdes.String()))
                .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("counts"))
                .toStream()
                .to(kit.get("output"), Produced.with(Serdes.String(), Serdes.Long()));
        return builder.build();
    }

    private static void run(Kit kit) throws Exception {
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, kit.get("app-id"));
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, kit.bootstrap());
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.STATE_DIR_CONFIG, kit.get("state-dir"));
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, "1");
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, "0");
        props.put(StreamsConfig.topicPrefix("segment.ms"), "200");
        props.put(StreamsConfig.topicPrefix("min.cleanable.dirty.ratio"), "0.01");
        String topicConfig = kit.get("topic-config", "");
        if (!topicConfig.isEmpty()) {  // name=value, for every internal topic
            String[] pair = topicConfig.split("=", 2);
            props.put(StreamsConfig.topicPrefix(pair[0]), pair[1]);
        }
        String consumerConfig = kit.get("main-consumer-config", "");
        if (!consumerConfig.isEmpty()) {  // name=value, for the main consumer
            String[] pair = consumerConfig.split("=", 2);
            props.put(StreamsConfig.mainConsumerPrefix(pair[0]), pair[1]);
        }
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), "6000");
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG),
                "500");
        Topology topology = topology(kit);
        emit("op", "topology", "description", topology.describe().toString());
        KafkaStreams streams = new KafkaStreams(topology, props);
        AtomicLong offsetWarnings = countOffsetWarnings();
        streams.setStateListener((now, before) ->
                emit("op", "state", "state", now.toString(), "before", before.toString(),
                        "ms", System.currentTimeMillis()));
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            @Override
            public void onRestoreStart(TopicPartition tp, String store, long start, long end) {
                emit("op", "restore-start", "topic", tp.topic(), "partition", tp.partition(),
                        "start", start, "end", end, "ms", System.currentTimeMillis());
            }

            @Override
            public void onBatchRestored(TopicPartition tp, String store, long end, long n) {
            }

            @Override
            public void onRestoreEnd(TopicPartition tp, String store, long total) {
                emit("op", "restored", "topic", tp.topic(), "partition", tp.partition(),
                        "records", total, "ms", System.currentTimeMillis());
            }
        });
        Kit.runStreams(streams);
        emit("op", "offset-warnings", "count", offsetWarnings.get());
    }

    /** Counts RecordCollectorImpl's "Received offset=-1" warnings instead of
     * printing them; its other lines go to the usual appenders. */
    private static AtomicLong countOffsetWarnings() {
        AtomicLong count = new AtomicLong();
        Logger collector = Logger.getLogger(
                "org.apache.kafka.streams.processor.internals.RecordCollectorImpl");
        collector.setAdditivity(false);
        collector.addAppender(new AppenderSkeleton() {
            @Override
            protected void append(LoggingEvent event) {
                if (event.getLevel() == Level.WARN
                        && String.valueOf(event.getMessage()).contains("offset=-1")) {
                    count.incrementAndGet();
                } else {
                    Logger.getRootLogger().callAppenders(event);
                }
            }

            @Override
            public void close() {
            }

            @Override
            public boolean requiresLayout() {
                return false;
            }
        });
        return count;
    }

    private static void dump(Kit kit) {
        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < kit.integer("partitions", 1); p++) {
            tps.add(new TopicPartition(kit.get("output"), p));
        }
        Properties props = kit.consumer(null);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        try (var consumer = new KafkaConsumer<byte[], byte[]>(props)) {
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            Map<TopicPartition, Long> ends = consumer.endOffsets(tps, Kit.TIMEOUT);
            Map<String, Object> counts = new TreeMap<>();
            long deadline = System.nanoTime() + Kit.TIMEOUT.toNanos();
            while (tps.stream().anyMatch(tp -> consumer.position(tp) < ends.get(tp))) {
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("not at the end offsets " + ends);
                }
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(100))) {
                    counts.put(Kit.text(r.key()), ByteBuffer.wrap(r.value()).getLong());
                }
            }
            emit("op", "counts", "counts", counts);
        }
    }
}

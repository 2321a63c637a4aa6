package javatxn;

import static javaclient.Kit.emit;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import javaclient.Kit;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;

/**
 * A stateless Kafka Streams 3.4.1 reshard with processing.guarantee=exactly_once_v2:
 * source -> selectKey(user id from the value) -> to(target), so the target is
 * partitioned by user. Commands:
 *
 *   produce --bootstrap B --source S --partitions P --users U --from F --count N
 *       values "u<n % U> seq=<n>" for n in [F, F + N), each user's records on
 *       source partition (n % U) % P, so every user's records are in one
 *       partition, in seq order
 *   run --bootstrap B --app-id A --source S --target T --state-dir D
 *       [--delay-ms MS] [--repartition by-user]
 *       the app, until stdin says "stop" (or closes); prints its state changes
 *       and its topology's internal topics. --delay-ms slows each record (so a
 *       test can kill it mid-stream); --repartition routes through an explicit
 *       repartition topic before to() (an internal topic Streams creates)
 *   dump --bootstrap B --target T --partitions P
 *       every record of the target a read_committed consumer sees, as
 *       [partition, offset, key, value]
 */
public final class ReshardStreams {
    public static void main(String[] args) throws Exception {
        Kit kit = Kit.parse(args);
        switch (kit.command) {
            case "produce" -> produce(kit);
            case "run" -> run(kit);
            case "dump" -> dump(kit);
            default -> throw new IllegalArgumentException("unknown command " + kit.command);
        }
    }

    static String user(String value) {
        return value.substring(0, value.indexOf(' '));
    }

    private static void produce(Kit kit) throws Exception {
        int partitions = kit.integer("partitions", 1);
        int users = kit.integer("users", 20);
        int from = kit.integer("from", 0);
        int count = kit.integer("count", 100);
        var props = kit.producer();
        props.put("linger.ms", "5");
        List<Future<RecordMetadata>> acks = new ArrayList<>();
        try (var producer = new KafkaProducer<byte[], byte[]>(props)) {
            for (int n = from; n < from + count; n++) {
                acks.add(producer.send(new ProducerRecord<>(kit.get("source"),
                        (n % users) % partitions, null, Kit.bytes("u" + (n % users) + " seq=" + n))));
            }
            for (Future<RecordMetadata> ack : acks) {
                ack.get(60, TimeUnit.SECONDS);  // idempotent: in order, each once
            }
        }
        emit("op", "produced", "count", count);
    }

    static Topology topology(Kit kit) {
        int delayMs = kit.integer("delay-ms", 0);
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, String> rekeyed = builder
                .stream(kit.get("source"), Consumed.with(Serdes.String(), Serdes.String()))
                .peek((k, v) -> {
                    if (delayMs > 0) {
                        try {
                            Thread.sleep(delayMs);
                        } catch (InterruptedException e) {
                            Thread.currentThread().interrupt();
                        }
                    }
                })
                .selectKey((k, v) -> user(v));
        String repartition = kit.get("repartition", "");
        if (!repartition.isEmpty()) {
            rekeyed = rekeyed.repartition(Repartitioned.<String, String>as(repartition)
                    .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()));
        }
        rekeyed.to(kit.get("target"), Produced.with(Serdes.String(), Serdes.String()));
        return builder.build();
    }

    private static void run(Kit kit) throws Exception {
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, kit.get("app-id"));
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, kit.bootstrap());
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.STATE_DIR_CONFIG, kit.get("state-dir"));
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, "1");
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), "6000");
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG),
                "500");
        Topology topology = topology(kit);
        emit("op", "topology", "description", topology.describe().toString());
        KafkaStreams streams = new KafkaStreams(topology, props);
        streams.setStateListener((now, before) ->
                emit("op", "state", "state", now.toString(), "before", before.toString()));
        Kit.runStreams(streams);
    }

    private static void dump(Kit kit) {
        List<TopicPartition> tps = Txn.partitions(kit.get("target"), kit.integer("partitions", 1));
        try (var consumer = new KafkaConsumer<byte[], byte[]>(
                Txn.consumer(kit, null, TxnCheck.COMMITTED))) {
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            var ends = consumer.endOffsets(tps, Kit.TIMEOUT);
            List<Object> out = new ArrayList<>();
            long deadline = System.nanoTime() + Kit.TIMEOUT.toNanos();
            while (tps.stream().anyMatch(tp -> consumer.position(tp) < ends.get(tp))) {
                Txn.check(deadline, "the end offsets " + ends);
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(100))) {
                    out.add(List.of(r.partition(), r.offset(), Kit.text(r.key()),
                            Kit.text(r.value())));
                }
            }
            emit("op", "records", "records", out);
        }
    }
}

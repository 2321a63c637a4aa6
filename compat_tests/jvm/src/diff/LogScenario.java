package diff;

import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;

/** Produce with each codec, offsets, listOffsets, offsetsForTimes, seek/poll, deleteRecords. */
final class LogScenario extends Scenario {
    LogScenario(String bootstrap, String prefix, long t0) {
        super(bootstrap, prefix, t0);
    }

    @Override
    void run() throws Exception {
        String topic = prefix + "-log";
        List<TopicPartition> partitions = List.of(
            new TopicPartition(topic, 0), new TopicPartition(topic, 1), new TopicPartition(topic, 2));
        try (Admin admin = admin()) {
            emit("create", map("outcome", outcome(admin.createTopics(
                List.of(new NewTopic(topic, 3, (short) 1))).all())));
            produce(topic);
            listOffsets(admin, partitions);
            try (KafkaConsumer<byte[], byte[]> consumer = consumer("none", "read_uncommitted")) {
                positions(consumer, partitions);
                read(consumer, "read-all", partitions, Map.of(0, 0L, 1, 0L, 2, 0L));
                read(consumer, "read-inside-batches", partitions, Map.of(0, 5L, 1, 3L, 2, 1L));
                read(consumer, "read-at-end", partitions, Map.of(0, 9L, 1, 8L, 2, 4L));
                read(consumer, "read-past-end", partitions, Map.of(0, 50L));
            }
            emit("delete-records", map("low_watermarks", deleteRecords(admin, Map.of(
                new TopicPartition(topic, 0), 4L, new TopicPartition(topic, 1), 8L))));
            listOffsets(admin, partitions);
            try (KafkaConsumer<byte[], byte[]> consumer = consumer("none", "read_uncommitted")) {
                positions(consumer, partitions);
                read(consumer, "read-deleted", partitions, Map.of(0, 1L));
                read(consumer, "read-after-delete", partitions, Map.of(0, 4L, 1, 8L));
            }
            try (KafkaConsumer<byte[], byte[]> consumer = consumer("earliest", "read_committed")) {
                read(consumer, "reset-to-earliest", partitions, Map.of(0, 2L, 1, 0L, 2, 0L));
            }
        }
    }

    /** p0: one record at a time, then a batch; p1: one batch per codec; p2: a few. */
    private void produce(String topic) throws Exception {
        try (KafkaProducer<byte[], byte[]> producer = producer("none")) {
            for (int i = 0; i < 3; i++) {
                Future<RecordMetadata> sent = producer.send(new ProducerRecord<>(topic, 0, t0 + i,
                    bytes("k" + i), bytes("single-" + i)));
                producer.flush(); // one record per batch
                emit("produce-single", metadata(sent.get()));
            }
        }
        for (int c = 0; c < CODECS.length; c++) {
            try (KafkaProducer<byte[], byte[]> producer = producer(CODECS[c])) {
                List<Future<RecordMetadata>> sent = new ArrayList<>();
                int partition = c == 0 ? 0 : 1;
                for (int i = 0; i < (c == 0 ? 6 : 2); i++) {
                    ProducerRecord<byte[], byte[]> record = new ProducerRecord<>(topic, partition,
                        t0 + 1000L * (c + 1) + 10L * i, bytes("key-" + i),
                        bytes(CODECS[c] + "-" + i + "-" + "x".repeat(100)));
                    record.headers().add("codec", bytes(CODECS[c]));
                    sent.add(producer.send(record));
                }
                producer.flush();
                for (Future<RecordMetadata> future : sent) {
                    emit("produce-" + CODECS[c], metadata(future.get()));
                }
            }
        }
        try (KafkaProducer<byte[], byte[]> producer = producer("gzip")) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < 4; i++) {
                sent.add(producer.send(new ProducerRecord<>(topic, 2, t0 + 9000L + i, null,
                    i == 2 ? null : bytes("p2-" + i))));
            }
            producer.flush();
            for (Future<RecordMetadata> future : sent) {
                emit("produce-p2", metadata(future.get()));
            }
        }
    }

    private static Map<String, Object> metadata(RecordMetadata sent) {
        return map("partition", sent.partition(), "offset", sent.offset(),
                   "timestamp", sent.timestamp(), "key_size", sent.serializedKeySize(),
                   "value_size", sent.serializedValueSize());
    }

    private void listOffsets(Admin admin, List<TopicPartition> partitions) throws Exception {
        Map<String, OffsetSpec> specs = new LinkedHashMap<>();
        specs.put("earliest", OffsetSpec.earliest());
        specs.put("latest", OffsetSpec.latest());
        specs.put("max-timestamp", OffsetSpec.maxTimestamp());
        long[] times = {t0 - 5000, t0, t0 + 1, t0 + 1015, t0 + 1050, t0 + 2005, t0 + 3010,
                        t0 + 5000, t0 + 9002, t0 + 99_999};
        for (long time : times) {
            specs.put("at-" + (time - t0), OffsetSpec.forTimestamp(time));
        }
        for (IsolationLevel isolation : IsolationLevel.values()) {
            for (Map.Entry<String, OffsetSpec> spec : specs.entrySet()) {
                Map<TopicPartition, OffsetSpec> request = new LinkedHashMap<>();
                partitions.forEach(tp -> request.put(tp, spec.getValue()));
                Map<String, Object> fields = new LinkedHashMap<>();
                try {
                    Map<TopicPartition, ListOffsetsResultInfo> result = admin.listOffsets(
                        request, new ListOffsetsOptions(isolation)).all().get();
                    for (TopicPartition tp : partitions) {
                        ListOffsetsResultInfo info = result.get(tp);
                        fields.put("p" + tp.partition(), map("offset", info.offset(),
                            "timestamp", info.timestamp(),
                            "leader_epoch", info.leaderEpoch().orElse(null)));
                    }
                } catch (ExecutionException e) {
                    fields.put("error", failure(e));
                }
                emit("list-offsets-" + isolation.name().toLowerCase() + "-" + spec.getKey(), fields);
            }
        }
    }

    private void positions(KafkaConsumer<byte[], byte[]> consumer, List<TopicPartition> partitions)
            throws Exception {
        emit("beginning-offsets", map("offsets", byPartition(consumer.beginningOffsets(partitions))));
        emit("end-offsets", map("offsets", byPartition(consumer.endOffsets(partitions))));
        for (long delta : new long[] {-1000, 0, 15, 1010, 2000, 9003, 50_000}) {
            Map<TopicPartition, Long> query = new LinkedHashMap<>();
            partitions.forEach(tp -> query.put(tp, t0 + delta));
            Map<String, Object> found = new TreeMap<>();
            consumer.offsetsForTimes(query).forEach((tp, at) -> found.put("p" + tp.partition(),
                at == null ? null : map("offset", at.offset(), "timestamp", at.timestamp(),
                                        "leader_epoch", at.leaderEpoch().orElse(null))));
            emit("offsets-for-times-" + delta, found);
        }
    }

    private static Map<String, Object> byPartition(Map<TopicPartition, Long> offsets) {
        Map<String, Object> out = new TreeMap<>();
        offsets.forEach((tp, offset) -> out.put("p" + tp.partition(), offset));
        return out;
    }

    /** Seek each partition to its offset and poll until every one reaches its end. */
    private void read(KafkaConsumer<byte[], byte[]> consumer, String step,
                      List<TopicPartition> all, Map<Integer, Long> starts) throws Exception {
        List<TopicPartition> assigned = new ArrayList<>();
        all.stream().filter(tp -> starts.containsKey(tp.partition())).forEach(assigned::add);
        consumer.assign(assigned);
        for (TopicPartition tp : assigned) {
            consumer.seek(tp, starts.get(tp.partition()));
        }
        Map<TopicPartition, Long> ends = consumer.endOffsets(assigned);
        List<Object> records = new ArrayList<>();
        String error = null;
        long deadline = System.currentTimeMillis() + 20_000;
        try {
            do { // at least one poll: a position out of range only fails there
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    List<Object> headers = new ArrayList<>();
                    for (Header h : r.headers()) {
                        headers.add(List.of(h.key(), text(h.value())));
                    }
                    records.add(map("partition", r.partition(), "offset", r.offset(),
                        "timestamp", r.timestamp(), "timestamp_type", r.timestampType().name,
                        "key", text(r.key()), "value", text(r.value()), "headers", headers,
                        "leader_epoch", r.leaderEpoch().orElse(null),
                        "key_size", r.serializedKeySize(), "value_size", r.serializedValueSize()));
                }
            } while (System.currentTimeMillis() < deadline
                     && assigned.stream().anyMatch(tp -> consumer.position(tp) < ends.get(tp)));
        } catch (Exception e) {
            error = failure(e);
        }
        Map<String, Object> positions = new TreeMap<>();
        if (error == null) {
            assigned.forEach(tp -> positions.put("p" + tp.partition(), consumer.position(tp)));
        }
        emit(step, map("records", records, "positions", positions, "error", error));
    }

    private static Map<String, Object> deleteRecords(Admin admin, Map<TopicPartition, Long> before)
            throws Exception {
        Map<TopicPartition, RecordsToDelete> request = new LinkedHashMap<>();
        before.forEach((tp, offset) -> request.put(tp, RecordsToDelete.beforeOffset(offset)));
        Map<String, Object> out = new TreeMap<>();
        admin.deleteRecords(request).lowWatermarks().forEach((tp, future) -> {
            try {
                out.put("p" + tp.partition(), future.get().lowWatermark());
            } catch (Exception e) {
                out.put("p" + tp.partition(), failure(e));
            }
        });
        return out;
    }
}

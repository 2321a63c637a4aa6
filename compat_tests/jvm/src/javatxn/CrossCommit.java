package javatxn;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;

import javaclient.Kit;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;

/**
 * One transaction, committed when told (compat_tests/test_pg_cross_commits.py):
 * writes --records records into each of --partitions of --topic, flushes
 * (every batch acknowledged: staged), prints {"staged": true}, then waits
 * for a "commit" line on stdin, commits and prints {"committed": true,
 * "ms": how long commitTransaction took}, and ends at "stop".
 */
public final class CrossCommit {
    private CrossCommit() {
    }

    public static void main(String[] args) throws Exception {
        Kit kit = Kit.parse(args);
        String topic = kit.get("topic");
        int records = kit.integer("records", 5);
        BufferedReader in = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (KafkaProducer<byte[], byte[]> producer = Txn.producer(kit, kit.get("txn-id"))) {
            producer.initTransactions();
            producer.beginTransaction();
            for (String part : kit.get("partitions").split(",")) {
                int partition = Integer.parseInt(part);
                for (int i = 0; i < records; i++) {
                    byte[] value = ("m-" + partition + "-" + i).getBytes(StandardCharsets.UTF_8);
                    producer.send(new ProducerRecord<>(topic, partition, null, value));
                }
            }
            producer.flush();
            Kit.emit("staged", true);
            String line = in.readLine();
            if (!"commit".equals(line)) {
                throw new IllegalStateException("expected commit, got " + line);
            }
            long started = System.nanoTime();
            producer.commitTransaction();
            Kit.emit("committed", true, "ms", (System.nanoTime() - started) / 1e6);
            in.readLine();  // "stop", or the end of stdin
        }
    }
}

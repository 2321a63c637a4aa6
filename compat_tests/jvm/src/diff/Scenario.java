package diff;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/** What every scenario shares: the server, names, clients and JSON output. */
abstract class Scenario {
    static final ObjectMapper JSON = new ObjectMapper();
    static final String[] CODECS = {"none", "gzip", "snappy", "lz4", "zstd"};

    final String bootstrap;
    final String prefix;
    final long t0;

    Scenario(String bootstrap, String prefix, long t0) {
        this.bootstrap = bootstrap;
        this.prefix = prefix;
        this.t0 = t0;
    }

    /** Runs the scenario, printing what the client sees. */
    abstract void run() throws Exception;

    // ------------------------------------------------------------------ output
    static void emit(String step, Map<String, Object> fields) throws Exception {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("step", step);
        line.putAll(fields);
        System.out.println(JSON.writeValueAsString(line));
        System.out.flush();
    }

    static Map<String, Object> map(Object... pairs) {
        Map<String, Object> out = new LinkedHashMap<>();
        for (int i = 0; i < pairs.length; i += 2) {
            out.put((String) pairs[i], pairs[i + 1]);
        }
        return out;
    }

    /** The exception a client call ended with, by class: messages are each server's own. */
    static String failure(Throwable error) {
        Throwable cause = error instanceof ExecutionException && error.getCause() != null
            ? error.getCause() : error;
        return cause.getClass().getSimpleName();
    }

    static Object outcome(Future<?> future) {
        try {
            future.get();
            return "ok";
        } catch (Exception e) {
            return failure(e);
        }
    }

    // ------------------------------------------------------------------ clients
    Admin admin() {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        return Admin.create(props);
    }

    KafkaProducer<byte[], byte[]> producer(String codec) {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
        props.put(ProducerConfig.LINGER_MS_CONFIG, "60000"); // one batch per flush
        props.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "30000");
        return new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
    }

    KafkaConsumer<byte[], byte[]> consumer(String reset, String isolation) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, reset);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "1000");
        return new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    static String text(byte[] data) {
        return data == null ? null : new String(data, StandardCharsets.UTF_8);
    }
}

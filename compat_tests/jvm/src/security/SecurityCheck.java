package security;

import java.io.FileReader;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutionException;

import javaclient.Kit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The Java client through a secured listener; the security settings come from
 * a client properties file, as a user would write it.
 *
 *   roundtrip --bootstrap B --topic T --props FILE
 *       describeCluster, produce three records (the default, idempotent,
 *       producer), read them back as a group member.
 *   refused --bootstrap B --props FILE
 *       listTopics must fail: prints the exception's class and message.
 */
public final class SecurityCheck {
    public static void main(String[] args) throws Exception {
        Kit kit = Kit.parse(args);
        Properties props = new Properties();
        try (FileReader reader = new FileReader(kit.get("props"))) {
            props.load(reader);
        }
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, kit.bootstrap());
        switch (kit.command) {
            case "roundtrip" -> roundtrip(props, kit.get("topic"));
            case "refused" -> refused(props);
            default -> throw new IllegalArgumentException("unknown command " + kit.command);
        }
    }

    private static void roundtrip(Properties base, String topic) throws Exception {
        List<String> brokers = new ArrayList<>();
        try (Admin admin = Admin.create(base)) {
            for (Node node : admin.describeCluster().nodes().get()) {
                brokers.add(node.host() + ":" + node.port());
            }
        }
        Properties producerProps = new Properties();
        producerProps.putAll(base);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(
                producerProps, new StringSerializer(), new StringSerializer())) {
            for (String value : List.of("one", "two", "three")) {
                producer.send(new ProducerRecord<>(topic, value)).get();
            }
        }
        Properties consumerProps = new Properties();
        consumerProps.putAll(base);
        consumerProps.put(ConsumerConfig.GROUP_ID_CONFIG, topic + "-group");
        consumerProps.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        List<String> values = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(
                consumerProps, new StringDeserializer(), new StringDeserializer())) {
            consumer.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + 60_000;
            while (values.size() < 3 && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(500))) {
                    values.add(r.value());
                }
            }
            consumer.commitSync();
        }
        Kit.emit("op", "roundtrip", "values", values, "brokers", brokers);
    }

    private static void refused(Properties props) throws InterruptedException {
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "15000");
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        try (Admin admin = Admin.create(props)) {
            admin.listTopics().names().get();
            Kit.emit("op", "refused", "refused", false);
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            Kit.emit("op", "refused", "refused", true, "error", cause.getClass().getSimpleName(),
                     "message", String.valueOf(cause.getMessage()));
        }
    }
}

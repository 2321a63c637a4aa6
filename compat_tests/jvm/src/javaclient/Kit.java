package javaclient;

import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;

/**
 * What the Java test programs share: {@code --name value} arguments, one JSON
 * object per stdout line for pytest to parse, and client settings.
 *
 * Only these JSON lines go to stdout: the logging (log4j's console appender)
 * is sent to stderr, which pytest quotes when a test fails.
 */
public final class Kit {
    private static final PrintStream OUT =
            new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
    public static final Duration TIMEOUT = Duration.ofSeconds(60);

    private final Map<String, String> options = new HashMap<>();
    public final String command;

    static {
        System.setOut(System.err);  // before log4j starts: its console appender takes stderr
    }

    private Kit(String[] args) {
        if (args.length == 0 || args[0].startsWith("--")) {
            throw new IllegalArgumentException("usage: <command> [--name value]...");
        }
        command = args[0];
        for (int i = 1; i < args.length; i += 2) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) {
                throw new IllegalArgumentException("expected --name value at " + args[i]);
            }
            options.put(args[i].substring(2), args[i + 1]);
        }
    }

    public static Kit parse(String[] args) {
        return new Kit(args);
    }

    public String get(String name) {
        String value = options.get(name);
        if (value == null) {
            throw new IllegalArgumentException("missing --" + name);
        }
        return value;
    }

    public String get(String name, String fallback) {
        return options.getOrDefault(name, fallback);
    }

    public int integer(String name, int fallback) {
        return options.containsKey(name) ? Integer.parseInt(options.get(name)) : fallback;
    }

    public String bootstrap() {
        return get("bootstrap");
    }

    // ------------------------------------------------------------------ settings

    public Properties admin() {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap());
        props.put("request.timeout.ms", "30000");
        props.put("default.api.timeout.ms", "60000");
        return props;
    }

    /** A producer with acks=all and byte-array serializers. */
    public Properties producer() {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap());
        props.put("key.serializer", "org.apache.kafka.common.serialization.ByteArraySerializer");
        props.put("value.serializer", "org.apache.kafka.common.serialization.ByteArraySerializer");
        props.put("acks", "all");  // the default too; idempotence stays on (the default)
        props.put("max.block.ms", "60000");
        return props;
    }

    /** A consumer reading byte arrays, committing only when told to. */
    public Properties consumer(String group) {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap());
        props.put("key.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        props.put("value.deserializer",
                "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        props.put("enable.auto.commit", "false");
        props.put("auto.offset.reset", "earliest");
        props.put("fetch.max.wait.ms", "100");
        if (group != null) {
            props.put("group.id", group);
        }
        return props;
    }

    // ------------------------------------------------------------------ output

    /** Print one JSON object from alternating keys and values. */
    public static void emit(Object... keysAndValues) {
        print(map(keysAndValues));
    }

    public static void print(Map<String, Object> object) {
        OUT.println(json(object));
    }

    public static Map<String, Object> map(Object... keysAndValues) {
        Map<String, Object> out = new LinkedHashMap<>();
        for (int i = 0; i < keysAndValues.length; i += 2) {
            out.put((String) keysAndValues[i], keysAndValues[i + 1]);
        }
        return out;
    }

    /** A record as the tests compare it; byte arrays are read as UTF-8 text. */
    public static Map<String, Object> record(ConsumerRecord<byte[], byte[]> r) {
        List<Object> headers = new ArrayList<>();
        for (Header h : r.headers()) {
            headers.add(List.of(h.key(), text(h.value())));
        }
        return map("partition", r.partition(), "offset", r.offset(), "timestamp", r.timestamp(),
                "key", text(r.key()), "value", text(r.value()), "headers", headers);
    }

    public static String text(byte[] bytes) {
        return bytes == null ? null : new String(bytes, StandardCharsets.UTF_8);
    }

    public static byte[] bytes(String text) {
        return text == null ? null : text.getBytes(StandardCharsets.UTF_8);
    }

    /**
     * The error a client call failed with: its class and message (futures
     * unwrapped), and the chain of causes below it as "Class: message".
     */
    public static Map<String, Object> error(Throwable t) {
        while (t instanceof ExecutionException && t.getCause() != null) {
            t = t.getCause();
        }
        List<String> causes = new ArrayList<>();
        for (Throwable c = t.getCause(); c != null && causes.size() < 5; c = c.getCause()) {
            causes.add(c.getClass().getSimpleName() + ": " + c.getMessage());
        }
        return map("error", t.getClass().getSimpleName(), "message", t.getMessage(),
                "causes", causes);
    }

    /**
     * Runs a Kafka Streams app until "stop" (or the end) on stdin, then closes
     * it: a thread that dies shuts the app down and is reported ("uncaught"),
     * and the last line says whether it closed cleanly, with those errors.
     */
    public static void runStreams(KafkaStreams streams) throws IOException {
        List<Object> errors = new ArrayList<>();
        streams.setUncaughtExceptionHandler(e -> {
            errors.add(error(e));
            emit("op", "uncaught", "error", error(e));
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();
        var stdin = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line = stdin.readLine(); line != null && !line.trim().equals("stop");
             line = stdin.readLine()) {
            // anything else on stdin is ignored
        }
        boolean closed = streams.close(Duration.ofSeconds(60));
        emit("op", "closed", "clean", closed, "errors", errors);
    }

    private static String json(Object value) {
        if (value == null) {
            return "null";
        }
        if (value instanceof Number || value instanceof Boolean) {
            return value.toString();
        }
        if (value instanceof Map<?, ?> m) {
            StringBuilder out = new StringBuilder("{");
            Iterator<? extends Map.Entry<?, ?>> it = m.entrySet().iterator();
            while (it.hasNext()) {
                Map.Entry<?, ?> e = it.next();
                out.append(json(String.valueOf(e.getKey()))).append(':').append(json(e.getValue()));
                out.append(it.hasNext() ? "," : "");
            }
            return out.append('}').toString();
        }
        if (value instanceof Collection<?> c) {
            StringBuilder out = new StringBuilder("[");
            Iterator<?> it = c.iterator();
            while (it.hasNext()) {
                out.append(json(it.next())).append(it.hasNext() ? "," : "");
            }
            return out.append(']').toString();
        }
        StringBuilder out = new StringBuilder("\"");
        for (char ch : value.toString().toCharArray()) {
            switch (ch) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                default -> {
                    if (ch < 0x20) {
                        out.append(String.format("\\u%04x", (int) ch));
                    } else {
                        out.append(ch);
                    }
                }
            }
        }
        return out.append('"').toString();
    }
}

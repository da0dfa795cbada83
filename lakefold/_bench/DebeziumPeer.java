// The capture peer of `lakefold bench capture`: Debezium's embedded engine (PostgreSQL
// connector, pgoutput) draining an existing slot into a consumer that only counts, run by the
// bench with `java -cp '<jars>/*' DebeziumPeer.java ...` (the jars from `make peers`).
//
//   DebeziumPeer host port user database slot publication table changes mode
//
// mode "throughput": stream (no snapshot) until `changes` change events are consumed; prints
//   {"changes": n, "seconds": from the engine's start, "seconds_from_first": from the first}.
// mode "latency": prints "ready" once the first change (a warm-up transaction) is consumed,
//   then consumes `changes` more; per transaction, the time from its commit (source.ts_ms) to
//   the consumption of its last change; prints {"p50_ms", "p99_ms", "transactions"}.
// Offsets are kept in memory: each run reads its own slot from its start. Batches are
// handed over after at most 10 ms (poll.interval.ms; Debezium's default is 500 ms).

import io.debezium.embedded.Connect;
import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.source.SourceRecord;

public class DebeziumPeer {
    public static void main(String[] args) throws Exception {
        String host = args[0], port = args[1], user = args[2], database = args[3];
        String slot = args[4], publication = args[5], table = args[6];
        long changes = Long.parseLong(args[7]);
        boolean latency = args[8].equals("latency");

        Properties props = new Properties();
        props.setProperty("name", "lakefold-bench-" + slot);
        props.setProperty("connector.class", "io.debezium.connector.postgresql.PostgresConnector");
        props.setProperty("offset.storage", "org.apache.kafka.connect.storage.MemoryOffsetBackingStore");
        props.setProperty("offset.flush.interval.ms", "60000");
        props.setProperty("database.hostname", host);
        props.setProperty("database.port", port);
        props.setProperty("database.user", user);
        props.setProperty("database.password", "");
        props.setProperty("database.dbname", database);
        props.setProperty("topic.prefix", "bench");
        props.setProperty("plugin.name", "pgoutput");
        props.setProperty("slot.name", slot);
        props.setProperty("publication.name", publication);
        props.setProperty("publication.autocreate.mode", "disabled");
        props.setProperty("table.include.list", table);
        props.setProperty("snapshot.mode", "no_data");
        props.setProperty("max.batch.size", "10240");
        props.setProperty("max.queue.size", "40960");
        // its default waits 500 ms for more events before handing a batch over; lakefold's
        // capture hands a transaction over as soon as it is stored
        props.setProperty("poll.interval.ms", "10");

        long total = latency ? changes + 1 : changes;
        AtomicLong seen = new AtomicLong();
        CountDownLatch done = new CountDownLatch(1);
        long[] firstAt = {0};
        Map<Long, long[]> transactions = new HashMap<>();  // txId -> {commit ms, last seen ms}

        DebeziumEngine<ChangeEvent<SourceRecord, SourceRecord>> engine =
            DebeziumEngine.create(Connect.class).using(props).notifying(event -> {
                SourceRecord record = event.value();
                if (record == null || !(record.value() instanceof Struct)) {
                    return;  // heartbeats, tombstones
                }
                Struct value = (Struct) record.value();
                if (value.schema().field("op") == null) {
                    return;
                }
                long n = seen.incrementAndGet();
                if (n == 1) {
                    firstAt[0] = System.nanoTime();
                    if (latency) {
                        System.out.println("ready");
                        System.out.flush();
                        return;
                    }
                }
                if (latency) {
                    Struct source = value.getStruct("source");
                    long now = System.currentTimeMillis();
                    long[] seenTx = transactions.computeIfAbsent(
                        source.getInt64("txId"), k -> new long[] {source.getInt64("ts_ms"), 0});
                    seenTx[1] = now;
                }
                if (n >= total) {
                    done.countDown();
                }
            }).build();

        long started = System.nanoTime();
        ExecutorService executor = Executors.newSingleThreadExecutor();
        executor.execute(engine);
        if (!done.await(3600, TimeUnit.SECONDS)) {
            System.err.println("timed out after " + seen.get() + " changes");
            System.exit(2);
        }
        long ended = System.nanoTime();
        engine.close();
        executor.shutdown();
        executor.awaitTermination(60, TimeUnit.SECONDS);
        if (latency) {
            List<Long> lags = new ArrayList<>();
            for (long[] tx : transactions.values()) {
                lags.add(tx[1] - tx[0]);
            }
            Collections.sort(lags);
            long p50 = lags.get(lags.size() / 2);
            long p99 = lags.get(Math.min(lags.size() - 1, (int) (lags.size() * 0.99)));
            System.out.println("{\"p50_ms\": " + p50 + ", \"p99_ms\": " + p99
                + ", \"transactions\": " + lags.size() + "}");
        } else {
            System.out.println("{\"changes\": " + seen.get() + ", \"seconds\": "
                + (ended - started) / 1e9 + ", \"seconds_from_first\": "
                + (ended - firstAt[0]) / 1e9 + "}");
        }
        System.exit(0);
    }
}

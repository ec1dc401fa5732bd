package io.txlog.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code readStream.format("txlog")} in the JVM: micro-batches whose offsets are
 * per-partition positions bounded by the last stable offset (read_committed) or the high
 * watermark, planned by txlog's Python planner ({@code stream_*} requests,
 * spark_ext/jvm_stream.py, the Python source's own stream logic) and read like a batch
 * scan by {@link PlannedScanProvider.PlannedScan}.
 *
 * <p>{@code maxOffsetsPerTrigger} is the default read limit (admission control);
 * {@code Trigger.AvailableNow} reads up to the positions current when the query starts.
 * This object keeps no state the planner needs: every request carries the options and
 * offsets, so a planner started again answers the same.
 */
final class TxlogMicroBatchStream implements MicroBatchStream, SupportsTriggerAvailableNow {
    private static final Logger LOG = LoggerFactory.getLogger(TxlogMicroBatchStream.class);

    private final Map<String, String> options;
    private final StructType readSchema;
    private final StructType schema;
    private final boolean kafka;
    private final boolean failOnDataLoss;
    private final long maxOffsetsPerTrigger;
    private final JsonNode hadoopConf;
    private String target;
    private String latest;

    TxlogMicroBatchStream(Map<String, String> options, String declared, StructType readSchema) {
        this.options = options;
        this.readSchema = readSchema;
        ObjectNode req = request("stream_open");
        if (declared != null) {
            req.put("declared", declared);
        }
        JsonNode open = Planner.call(req);  // checks the options as a streaming query's
        this.schema = PlannedScanProvider.parseSchema(open.get("schema").asText());
        this.kafka = open.get("kafka").asBoolean();
        this.failOnDataLoss = open.get("failOnDataLoss").asBoolean(true);
        JsonNode max = open.get("maxOffsetsPerTrigger");
        this.maxOffsetsPerTrigger = max == null || max.isNull() ? -1 : max.asLong();
        this.hadoopConf = open.get("hadoopConf");
        LOG.info("txlog: format(\"txlog\") streaming read through the JVM connector: {}", this);
    }

    private ObjectNode request(String op) {
        ObjectNode req = Planner.request(op);
        req.set("options", Planner.options(options));
        return req;
    }

    @Override
    public Offset initialOffset() {
        return StreamOffset.parse(Planner.call(request("stream_initial")).get("offset").asText());
    }

    @Override
    public Offset deserializeOffset(String json) {
        return StreamOffset.parse(json);
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
        return maxOffsetsPerTrigger > 0 ? ReadLimit.maxRows(maxOffsetsPerTrigger)
            : ReadLimit.allAvailable();
    }

    @Override
    public synchronized void prepareForTriggerAvailableNow() {
        target = Planner.call(request("stream_target")).get("offset").asText();
    }

    @Override
    public Offset latestOffset() {
        throw new UnsupportedOperationException(
            "txlog's stream takes a read limit: latestOffset(start, limit)");
    }

    @Override
    public synchronized Offset latestOffset(Offset start, ReadLimit limit) {
        ObjectNode req = request("stream_latest");
        req.put("start", start.json());
        if (limit instanceof ReadMaxRows) {
            req.put("maxRows", ((ReadMaxRows) limit).maxRows());
        } else {
            req.putNull("maxRows");
        }
        if (target != null) {
            req.put("target", target);
        }
        JsonNode answer = Planner.call(req);
        JsonNode now = answer.get("latest");
        latest = now == null || now.isNull() ? null : now.asText();
        return StreamOffset.parse(answer.get("offset").asText());
    }

    @Override
    public synchronized Offset reportLatestOffset() {
        return latest == null ? null : StreamOffset.parse(latest);
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
        ObjectNode req = request("stream_plan");
        req.put("start", start.json());
        req.put("end", end.json());
        req.put("planFormat", PlanFile.VERSION);
        JsonNode plan = Planner.call(req);
        PlannedScanProvider.PlannedTable t = TxlogScan.plannedTable(plan);
        HadoopSettings.apply(plan.get("hadoopConf"));
        return new PlannedScanProvider.PlannedScan(t, readSchema).planInputPartitions();
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        // How a slice is read depends on the columns and the topics' kind, not on the plan.
        HadoopSettings.apply(hadoopConf);
        PlannedScanProvider.PlannedTable t = new PlannedScanProvider.PlannedTable(
            schema, kafka, batchSize(), failOnDataLoss, new ArrayList<>());
        return new PlannedScanProvider.PlannedScan(t, readSchema).createReaderFactory();
    }

    static int batchSize() {
        return Integer.parseInt(SQLConf.get().getConfString(
            "spark.sql.parquet.columnarReaderBatchSize", "4096"));
    }

    @Override
    public void commit(Offset end) {
        // Nothing to release: positions live in Spark's checkpoint.
    }

    @Override
    public void stop() {
    }

    @Override
    public String toString() {
        List<String> what = new ArrayList<>();
        for (Map.Entry<String, String> e : options.entrySet()) {
            String k = e.getKey().toLowerCase(Locale.ROOT);
            if (k.equals("topic") || k.equals("subscribe") || k.equals("subscribepattern")
                || k.equals("assign")) {
                what.add(e.getKey() + "=" + e.getValue());
            }
        }
        return "txlog JVM stream [" + String.join(", ", what) + "]";
    }
}

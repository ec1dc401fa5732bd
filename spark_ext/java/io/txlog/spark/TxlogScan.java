package io.txlog.spark;

import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.Statistics;
import org.apache.spark.sql.connector.read.SupportsReportStatistics;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A batch read planned by txlog's Python planner when Spark asks for the batch, and read by
 * {@link PlannedScanProvider.PlannedScan}; a streaming read is a {@link TxlogMicroBatchStream}.
 */
final class TxlogScan implements Scan, SupportsReportStatistics {
    private static final Logger LOG = LoggerFactory.getLogger(TxlogScan.class);

    private final TxlogTable table;
    private final Map<String, String> options;
    private final StructType readSchema;
    private final ArrayNode filters;
    private final List<Filter> pushed;
    private PlannedScanProvider.PlannedScan planned;
    private String planSummary = "";

    TxlogScan(TxlogTable table, Map<String, String> options, StructType readSchema,
              ArrayNode filters, List<Filter> pushed) {
        this.table = table;
        this.options = options;
        this.readSchema = readSchema;
        this.filters = filters;
        this.pushed = pushed;
    }

    @Override
    public StructType readSchema() {
        return readSchema;
    }

    @Override
    public String description() {
        StringBuilder s = new StringBuilder("txlog JVM scan: columns [")
            .append(String.join(", ", readSchema.fieldNames())).append("], pushed filters [");
        for (int i = 0; i < pushed.size(); i++) {
            s.append(i > 0 ? ", " : "").append(pushed.get(i));
        }
        return s.append("]").append(planSummary).append(", reading ")
            .append(TxlogTable.describe(options)).toString();
    }

    @Override
    public synchronized Batch toBatch() {
        if (planned == null) {
            ObjectNode req = Planner.request("scan");
            req.set("options", Planner.options(options));
            if (table.declared()) {
                req.put("declared", table.schema().json());
            }
            req.set("filters", filters);
            req.put("planFormat", PlanFile.VERSION);
            req.put("parallelism", leafParallelism());
            JsonNode plan = Planner.call(req);
            PlannedScanProvider.PlannedTable t = plannedTable(plan);
            HadoopSettings.apply(plan.get("hadoopConf"));
            planned = new PlannedScanProvider.PlannedScan(t, readSchema);
            planSummary = ", " + plan.get("objects").asLong() + " of "
                + plan.get("objectsBeforePushdown").asLong() + " batch objects";
            LOG.info("txlog: format(\"txlog\") read through the JVM connector: {}", description());
        }
        return planned;
    }

    /** How many input partitions Spark aims a file scan at: its leaf nodes' default
     * parallelism (spark.sql.leafNodeDefaultParallelism, else the default parallelism). The
     * planner sizes the input partitions of a batch read by it, as Spark sizes file splits. */
    static int leafParallelism() {
        org.apache.spark.sql.classic.SparkSession s =
            org.apache.spark.sql.classic.SparkSession.active();
        String given = s.conf().get("spark.sql.leafNodeDefaultParallelism", null);
        int n = given != null ? Integer.parseInt(given) : s.sparkContext().defaultParallelism();
        return Math.max(1, n);
    }

    /** The planner's answer to a {@code scan} or {@code stream_plan} request, as a table of
     * the slices to read. */
    static PlannedScanProvider.PlannedTable plannedTable(JsonNode plan) {
        // The plan file first: it is deleted once read, whatever fails after.
        List<SlicePartition> slices = PlanFile.readAndDelete(plan.get("planFile").asText());
        StructType schema = PlannedScanProvider.parseSchema(plan.get("schema").asText());
        return new PlannedScanProvider.PlannedTable(
            schema, plan.get("kafka").asBoolean(), TxlogMicroBatchStream.batchSize(),
            plan.get("failOnDataLoss").asBoolean(true), slices);
    }

    @Override
    public org.apache.spark.sql.connector.metric.CustomMetric[] supportedCustomMetrics() {
        return DecoderMetrics.supported();
    }

    @Override
    public Statistics estimateStatistics() {
        // Planned now: the sizes let Spark choose joins (a broadcast of a small topic).
        return ((PlannedScanProvider.PlannedScan) toBatch()).estimateStatistics();
    }

    @Override
    public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
        return new TxlogMicroBatchStream(options,
                                         table.declared() ? table.schema().json() : null,
                                         readSchema);
    }
}

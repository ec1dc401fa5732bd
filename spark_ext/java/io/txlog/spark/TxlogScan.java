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
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A batch read planned by txlog's Python planner when Spark asks for the batch, and read by
 * {@link PlannedScanProvider.PlannedScan}; a streaming read is the Python source's.
 */
final class TxlogScan implements Scan, SupportsReportStatistics {
    private static final Logger LOG = LoggerFactory.getLogger(TxlogScan.class);

    private final TxlogTable table;
    private final Map<String, String> options;
    private final CaseInsensitiveStringMap queryOptions;
    private final StructType readSchema;
    private final ArrayNode filters;
    private final List<Filter> pushed;
    private PlannedScanProvider.PlannedScan planned;
    private String planSummary = "";

    TxlogScan(TxlogTable table, Map<String, String> options, CaseInsensitiveStringMap queryOptions,
              StructType readSchema, ArrayNode filters, List<Filter> pushed) {
        this.table = table;
        this.options = options;
        this.queryOptions = queryOptions;
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
        return s.append("]").append(planSummary).toString();
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
            JsonNode plan = Planner.call(req);
            StructType schema = PlannedScanProvider.parseSchema(plan.get("schema").asText());
            int batchSize = Integer.parseInt(SQLConf.get().getConfString(
                "spark.sql.parquet.columnarReaderBatchSize", "4096"));
            PlannedScanProvider.PlannedTable t = new PlannedScanProvider.PlannedTable(
                schema, plan.get("kafka").asBoolean(), batchSize,
                plan.get("failOnDataLoss").asBoolean(true),
                PlannedScanProvider.parsePlan(plan.get("plan").asText()));
            planned = new PlannedScanProvider.PlannedScan(t, readSchema);
            planSummary = ", " + plan.get("objects").asLong() + " of "
                + plan.get("objectsBeforePushdown").asLong() + " batch objects";
            LOG.info("txlog: format(\"txlog\") read through the JVM connector: {}", description());
        }
        return planned;
    }

    @Override
    public Statistics estimateStatistics() {
        // Planned now: the sizes let Spark choose joins (a broadcast of a small topic).
        return ((PlannedScanProvider.PlannedScan) toBatch()).estimateStatistics();
    }

    @Override
    public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
        LOG.info("txlog: format(\"txlog\") streaming read through txlog's Python data source");
        return ((org.apache.spark.sql.connector.catalog.SupportsRead) table.python())
            .newScanBuilder(queryOptions).build()
            .toMicroBatchStream(checkpointLocation);
    }
}

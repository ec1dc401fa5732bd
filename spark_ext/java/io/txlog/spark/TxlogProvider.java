package io.txlog.spark;

import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * txlog's Spark connector: {@code format("txlog")} as a DataSource V2 (found as
 * {@code txlog.DefaultSource}, see there). Batch and streaming reads and writes run here,
 * planned and committed by txlog's Python planner on the driver ({@link Planner}); writes
 * the JVM writer does not take (headers, typed topics, rows naming their topics), and
 * roots Spark has no filesystem for, go to txlog's Python data source through Spark's own
 * wrapper.
 */
public class TxlogProvider implements TableProvider, DataSourceRegister {
    /** The schema this instance inferred: a table given another one was declared by the
     * user, and the planner checks it. */
    private StructType inferred;

    @Override
    public String shortName() {
        return "txlog";
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        ObjectNode req = Planner.request("schema");
        req.set("options", Planner.options(options.asCaseSensitiveMap()));
        JsonNode answer = Planner.call(req);
        inferred = PlannedScanProvider.parseSchema(answer.get("schema").asText());
        return inferred;
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning,
                          Map<String, String> properties) {
        boolean declared = inferred == null || !inferred.equals(schema);
        return new TxlogTable(schema, declared, partitioning, properties);
    }
}

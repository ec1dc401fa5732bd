package io.txlog.spark;

import java.util.ArrayList;
import java.util.List;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** A read of a txlog table: the columns the query uses, and the filters that prune. */
final class TxlogScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns,
                                        SupportsPushDownFilters {
    private final TxlogTable table;
    private final CaseInsensitiveStringMap options;
    private StructType required;
    private final List<Filter> pushed = new ArrayList<>();
    private final ArrayNode filters = new ObjectMapper().createArrayNode();

    TxlogScanBuilder(TxlogTable table, CaseInsensitiveStringMap options) {
        this.table = table;
        this.options = options;
        this.required = table.schema();
    }

    @Override
    public void pruneColumns(StructType requiredSchema) {
        // Spark asks only for columns of our schema; keep our order and types.
        StructType pruned = new StructType();
        for (String name : table.schema().fieldNames()) {
            if (requiredSchema.getFieldIndex(name).isDefined()) {
                pruned = pruned.add(table.schema().apply(name));
            }
        }
        this.required = pruned;
    }

    @Override
    public Filter[] pushFilters(Filter[] all) {
        for (Filter f : all) {
            if (Pushdown.add(f, filters)) {
                pushed.add(f);
            }
        }
        return all;  // pruning is by batch object: Spark still filters the rows
    }

    @Override
    public Filter[] pushedFilters() {
        return pushed.toArray(new Filter[0]);
    }

    @Override
    public Scan build() {
        return new TxlogScan(table, table.options(options), required, filters.deepCopy(), pushed);
    }
}

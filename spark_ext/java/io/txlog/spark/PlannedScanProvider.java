package io.txlog.spark;

import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;
import java.util.Set;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.SparkContext;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.Statistics;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.connector.read.SupportsReportStatistics;
import org.apache.spark.sql.execution.datasources.parquet.ParquetReadSupport;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.util.SerializableConfiguration;

/**
 * Scans slices of txlog batch objects that the Python driver planned (spark_ext/jvm_scan.py).
 *
 * <p>The driver decides everything a read returns (which objects, which rows of each, their
 * base offsets); this source only reads those rows with Spark's vectorized Parquet reader and
 * adds the columns txlog derives (topic, partition, offset, timestamp, timestampType) as
 * computed column vectors, so no row is copied. Options:
 * <ul>
 *   <li>{@code txlog.schema}: the output schema (JSON);</li>
 *   <li>{@code txlog.kind}: {@code kafka} or {@code typed} (how timestamp is derived);</li>
 *   <li>{@code txlog.planFile}: the slices to read, grouped into input partitions, as a
 *       {@link PlanFile} (deleted once read);</li>
 *   <li>{@code txlog.batchSize}: rows per columnar batch;</li>
 *   <li>{@code txlog.failOnDataLoss}: {@code false} skips objects deleted since planning.</li>
 * </ul>
 */
public final class PlannedScanProvider implements TableProvider {
    static final String SCHEMA = "txlog.schema";
    static final String KIND = "txlog.kind";
    static final String PLAN_FILE = "txlog.planFile";
    static final String BATCH_SIZE = "txlog.batchSize";
    static final String FAIL_ON_DATA_LOSS = "txlog.failOnDataLoss";

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return parseSchema(required(options, SCHEMA));
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> props) {
        CaseInsensitiveStringMap options = new CaseInsensitiveStringMap(props);
        boolean kafka = "kafka".equals(required(options, KIND));
        int batchSize = Integer.parseInt(options.getOrDefault(BATCH_SIZE, "4096"));
        boolean failOnDataLoss = !"false".equals(options.getOrDefault(FAIL_ON_DATA_LOSS, "true"));
        return new PlannedTable(schema, kafka, batchSize, failOnDataLoss,
                                PlanFile.readAndDelete(required(options, PLAN_FILE)));
    }

    static String required(Map<String, String> options, String key) {
        String value = options.get(key);
        if (value == null) {
            throw new IllegalArgumentException(
                "txlog planned scan: option " + key + " is missing; this source is started by "
                    + "spark_ext.read(), not by hand");
        }
        return value;
    }

    static StructType parseSchema(String json) {
        return (StructType) DataType.fromJson(json);
    }

    /** {@code conf} set up for Spark's Parquet reader to read the stored columns of
     * {@code columns} with the types the scan returns. */
    static Configuration readerConf(Configuration conf, List<OutputColumn> columns) {
        conf.set("parquet.read.support.class", ParquetReadSupport.class.getName());
        conf.set(ParquetReadSupport.SPARK_ROW_REQUESTED_SCHEMA(),
                 OutputColumn.storedSchema(columns).json());
        conf.setBoolean(SQLConf.PARQUET_BINARY_AS_STRING().key(), false);
        conf.setBoolean(SQLConf.PARQUET_INT96_AS_TIMESTAMP().key(), true);
        conf.setBoolean(SQLConf.CASE_SENSITIVE().key(), true);
        conf.setBoolean(SQLConf.PARQUET_INFER_TIMESTAMP_NTZ_ENABLED().key(), true);
        conf.setBoolean(SQLConf.LEGACY_PARQUET_NANOS_AS_LONG().key(), false);
        // Parquet's decompressor takes a buffer of this size for every page it inflates;
        // Spark sets 64 KiB, mostly zeroed for nothing on the small pages of batch objects.
        conf.setInt("io.file.buffer.size", 8192);
        return conf;
    }

    static final class PlannedTable implements Table, SupportsRead {
        private final StructType schema;
        private final boolean kafka;
        private final int batchSize;
        private final boolean failOnDataLoss;
        private final List<SlicePartition> partitions;

        PlannedTable(StructType schema, boolean kafka, int batchSize, boolean failOnDataLoss,
                     List<SlicePartition> partitions) {
            this.schema = schema;
            this.kafka = kafka;
            this.batchSize = batchSize;
            this.failOnDataLoss = failOnDataLoss;
            this.partitions = partitions;
        }

        @Override
        public String name() {
            return "txlog planned scan";
        }

        @Override
        @SuppressWarnings("deprecation")  // columns() derives from it; Spark 4.3 still asks
        public StructType schema() {
            return schema;
        }

        @Override
        public Set<TableCapability> capabilities() {
            return EnumSet.of(TableCapability.BATCH_READ);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            return new Builder(this);
        }
    }

    static final class Builder implements ScanBuilder, SupportsPushDownRequiredColumns {
        private final PlannedTable table;
        private StructType required;

        Builder(PlannedTable table) {
            this.table = table;
            this.required = table.schema;
        }

        @Override
        public void pruneColumns(StructType requiredSchema) {
            // Spark asks only for columns of our schema; keep our order and types.
            StructType pruned = new StructType();
            for (String name : requiredSchema.fieldNames()) {
                pruned = pruned.add(table.schema.apply(name));
            }
            this.required = pruned;
        }

        @Override
        public Scan build() {
            return new PlannedScan(table, required);
        }
    }

    static final class PlannedScan implements Scan, Batch, SupportsReportStatistics {
        private final PlannedTable table;
        private final StructType readSchema;

        PlannedScan(PlannedTable table, StructType readSchema) {
            this.table = table;
            this.readSchema = readSchema;
        }

        @Override
        public StructType readSchema() {
            return readSchema;
        }

        @Override
        public String description() {
            int slices = 0;
            for (SlicePartition p : table.partitions) {
                slices += p.size();
            }
            return "txlog planned scan: " + slices + " slices in " + table.partitions.size()
                + " partitions, columns " + String.join(", ", readSchema.fieldNames());
        }

        @Override
        public Batch toBatch() {
            return this;
        }

        @Override
        public org.apache.spark.sql.connector.metric.CustomMetric[] supportedCustomMetrics() {
            return DecoderMetrics.supported();
        }

        @Override
        public InputPartition[] planInputPartitions() {
            return table.partitions.toArray(new InputPartition[0]);
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            List<OutputColumn> columns = OutputColumn.plan(readSchema, table.kafka);
            SparkSession session = SparkSession.active();
            SparkContext sc = session.sparkContext();
            // One Hadoop configuration for every object a task opens, as Spark's own Parquet
            // scan does: building one per object costs milliseconds each. It also carries
            // the session's filesystem settings (credentials, endpoints, including those set
            // with spark.conf.set at runtime) to the executors.
            Configuration conf = readerConf(session.sessionState().newHadoopConf(), columns);
            return new SliceReaderFactory(columns, table.batchSize, table.failOnDataLoss,
                                          SerializableConfiguration.broadcast(sc, conf));
        }

        @Override
        public Statistics estimateStatistics() {
            long bytes = 0;
            long rows = 0;
            for (SlicePartition p : table.partitions) {
                bytes += p.bytes();
                rows += p.rows();
            }
            final long b = bytes;
            final long r = rows;
            return new Statistics() {
                @Override
                public OptionalLong sizeInBytes() {
                    return OptionalLong.of(b);
                }

                @Override
                public OptionalLong numRows() {
                    return OptionalLong.of(r);
                }
            };
        }
    }
}

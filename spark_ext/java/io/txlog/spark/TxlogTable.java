package io.txlog.spark;

import java.util.ArrayList;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.execution.datasources.DataSourceManager;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/** A txlog root and subscription (reads) or target topic (writes), as Spark sees it. */
final class TxlogTable implements Table, SupportsRead, SupportsWrite {
    private static final Logger LOG = LoggerFactory.getLogger(TxlogTable.class);

    private final StructType schema;
    private final boolean declared;
    private final Transform[] partitioning;
    private final Map<String, String> properties;
    private Table python;

    TxlogTable(StructType schema, boolean declared, Transform[] partitioning,
               Map<String, String> properties) {
        this.schema = schema;
        this.declared = declared;
        this.partitioning = partitioning;
        this.properties = new HashMap<>(properties);
    }

    @Override
    public String name() {
        return "txlog";
    }

    @Override
    @SuppressWarnings("deprecation")  // columns() derives from it; Spark 4.3 still asks
    public StructType schema() {
        return schema;
    }

    /** What the table reads or writes, as plans and the streaming UI show it. */
    @Override
    public String toString() {
        return "txlog " + describe(properties);
    }

    /**
     * The topics and the root named by {@code options}, e.g. {@code [topic=out] at
     * s3://bucket/lake}: never {@code storage_options}, which may hold credentials.
     */
    static String describe(Map<String, String> options) {
        String[] names = {"topic", "subscribe", "subscribePattern", "assign"};
        String[] values = new String[names.length];
        String path = null;
        String location = null;
        for (Map.Entry<String, String> e : options.entrySet()) {
            String k = e.getKey().toLowerCase(Locale.ROOT);
            if (k.startsWith("option.")) {  // a catalog table's options
                k = k.substring("option.".length());
            }
            for (int i = 0; i < names.length; i++) {
                if (k.equals(names[i].toLowerCase(Locale.ROOT))) {
                    values[i] = e.getValue();
                }
            }
            if (k.equals("path")) {
                path = e.getValue();
            } else if (k.equals("location")) {
                location = e.getValue();
            }
        }
        List<String> what = new ArrayList<>();
        for (int i = 0; i < names.length; i++) {
            if (values[i] != null) {
                what.add(names[i] + "=" + values[i]);
            }
        }
        String root = path != null ? path : location;
        return "[" + String.join(", ", what) + "]" + (root == null ? "" : " at " + root);
    }

    @Override
    public Transform[] partitioning() {
        return partitioning;
    }

    @Override
    public Map<String, String> properties() {
        return properties;
    }

    @Override
    public Set<TableCapability> capabilities() {
        // The Python source's capabilities (streaming and truncation are passed to it), and
        // any input schema: a write's columns are checked by txlog, not by Spark.
        return EnumSet.of(TableCapability.BATCH_READ, TableCapability.BATCH_WRITE,
                          TableCapability.MICRO_BATCH_READ, TableCapability.STREAMING_WRITE,
                          TableCapability.TRUNCATE, TableCapability.ACCEPT_ANY_SCHEMA);
    }

    /** The table's options with the query's own on top. */
    Map<String, String> options(CaseInsensitiveStringMap query) {
        Map<String, String> all = new HashMap<>(properties);
        all.putAll(query.asCaseSensitiveMap());
        return all;
    }

    boolean declared() {
        return declared;
    }

    /** The same table as txlog's Python data source serves it (Spark's own wrapper). */
    synchronized Table python() {
        if (python == null) {
            // "txlog_python": the Python source under the name it keeps beside this
            // connector (spark_ext.register, pyspark_txlog_python's discovery); "txlog"
            // where only that is registered.
            DataSourceManager m = SparkSession.active().sessionState().dataSourceManager();
            String name = m.dataSourceExists("txlog_python") ? "txlog_python" : "txlog";
            if (!m.dataSourceExists(name)) {
                throw new TxlogException("txlog.errors.ConfigError",
                    "this read or write needs txlog's Python data source (rows the JVM writer "
                        + "does not take, or a root Spark cannot open), and this session has "
                        + "none: install "
                        + "txlog where the driver's Python finds it, or call "
                        + "spark_ext.register(spark)");
            }
            PythonDataSourceV2 source = new PythonDataSourceV2();
            source.setShortName(name);
            python = source.getTable(schema, partitioning, properties);
        }
        return python;
    }

    /** Why Spark's own Hadoop filesystems cannot open the root's objects (the JVM reader
     * and writer open them there), or null when they can. */
    String unreachable(Map<String, String> options) {
        String root = null;
        for (Map.Entry<String, String> e : options.entrySet()) {
            String k = e.getKey().toLowerCase(java.util.Locale.ROOT);
            if (k.equals("path") || k.equals("option.path")
                || (root == null && k.equals("location"))) {
                root = e.getValue();
            }
        }
        if (root == null) {
            return null;  // the planner says what is missing
        }
        String scheme;
        try {
            scheme = new org.apache.hadoop.fs.Path(root).toUri().getScheme();
        } catch (IllegalArgumentException e) {
            return null;
        }
        if (scheme == null || scheme.equals("file")) {
            return null;
        }
        if (scheme.equalsIgnoreCase("s3")) {
            scheme = "s3a";  // the planner names an s3:// root's objects s3a://
        }
        try {
            org.apache.hadoop.fs.FileSystem.getFileSystemClass(
                scheme, SparkSession.active().sessionState().newHadoopConf());
            return null;
        } catch (java.io.IOException | RuntimeException e) {
            return "Spark has no Hadoop filesystem for " + scheme + "://";
        }
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        String why = unreachable(options(options));
        if (why != null) {
            LOG.info("txlog: format(\"txlog\") read through txlog's Python data source: {}", why);
            return ((SupportsRead) python()).newScanBuilder(options);
        }
        return new TxlogScanBuilder(this, options);
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        return new TxlogWrite.Builder(this, info);
    }
}

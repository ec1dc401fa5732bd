package io.txlog.spark;

import org.apache.spark.sql.connector.metric.CustomMetric;
import org.apache.spark.sql.connector.metric.CustomSumMetric;
import org.apache.spark.sql.connector.metric.CustomTaskMetric;

/**
 * The scan's metrics of which decoder read its batch objects (shown with the scan in
 * Spark's UI and plan metrics): txlog's own, or Spark's Parquet reader (objects the former
 * does not handle, or every object with {@code txlog.scan.decoder=parquet}).
 */
public final class DecoderMetrics {
    static final String DIRECT = "objectsDecodedByTxlog";
    static final String PARQUET = "objectsDecodedByParquet";

    private DecoderMetrics() {
    }

    /** Spark instantiates these by name on the driver. */
    public static final class Direct extends CustomSumMetric {
        @Override public String name() { return DIRECT; }
        @Override public String description() { return "batch objects decoded by txlog"; }
    }

    public static final class Parquet extends CustomSumMetric {
        @Override public String name() { return PARQUET; }
        @Override public String description() {
            return "batch objects decoded by Spark's Parquet reader";
        }
    }

    static CustomMetric[] supported() {
        return new CustomMetric[] {new Direct(), new Parquet()};
    }

    static CustomTaskMetric[] values(long direct, long parquet) {
        return new CustomTaskMetric[] {task(DIRECT, direct), task(PARQUET, parquet)};
    }

    private static CustomTaskMetric task(String name, long value) {
        return new CustomTaskMetric() {
            @Override public String name() { return name; }
            @Override public long value() { return value; }
        };
    }
}

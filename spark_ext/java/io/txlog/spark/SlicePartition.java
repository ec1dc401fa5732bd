package io.txlog.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/** Rows [skip, skip + take) of each of a list of batch objects: one Spark input partition. */
final class SlicePartition implements InputPartition {
    private static final long serialVersionUID = 1L;

    final String[] paths;
    final String[] topics;
    final int[] partitions;
    final long[] bases;
    final long[] skips;
    final long[] takes;
    final long[] appendMs;
    final long[] objectBytes;  // declared size of the whole object; 0: unknown
    private long bytes;

    private SlicePartition(int n) {
        this.paths = new String[n];
        this.topics = new String[n];
        this.partitions = new int[n];
        this.bases = new long[n];
        this.skips = new long[n];
        this.takes = new long[n];
        this.appendMs = new long[n];
        this.objectBytes = new long[n];
    }

    /** A partition of {@code n} slices, filled in by {@link PlanFile}. */
    static SlicePartition ofSize(int n) {
        return new SlicePartition(n);
    }

    void addBytes(long estimated) {
        bytes += estimated;
    }

    int size() {
        return paths.length;
    }

    long bytes() {
        return bytes;
    }

    long rows() {
        long n = 0;
        for (long t : takes) {
            n += t;
        }
        return n;
    }
}

package io.txlog.spark;

import java.util.List;

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
    private final long bytes;

    private SlicePartition(int n, long bytes) {
        this.paths = new String[n];
        this.topics = new String[n];
        this.partitions = new int[n];
        this.bases = new long[n];
        this.skips = new long[n];
        this.takes = new long[n];
        this.appendMs = new long[n];
        this.objectBytes = new long[n];
        this.bytes = bytes;
    }

    static SlicePartition of(List<String[]> rows) {
        long bytes = 0;
        for (String[] f : rows) {
            bytes += Long.parseLong(f[8]);
        }
        SlicePartition p = new SlicePartition(rows.size(), bytes);
        for (int i = 0; i < rows.size(); i++) {
            String[] f = rows.get(i);
            p.paths[i] = f[1];
            p.topics[i] = f[2];
            p.partitions[i] = Integer.parseInt(f[3]);
            p.bases[i] = Long.parseLong(f[4]);
            p.skips[i] = Long.parseLong(f[5]);
            p.takes[i] = Long.parseLong(f[6]);
            p.appendMs[i] = Long.parseLong(f[7]);
            p.objectBytes[i] = f.length > 9 ? Long.parseLong(f[9]) : 0;
        }
        return p;
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

package io.txlog.spark;

import org.apache.spark.unsafe.Platform;

/** Kafka's default partitioner hash (murmur2, seed 0x9747b28c), as txlog.partitioner has it. */
final class Murmur2 {
    private Murmur2() {
    }

    /** The hash of {@code length} bytes at {@code base} + {@code offset} (Spark's unsafe
     * addressing: a byte array and its base offset, or off-heap memory), read in place. */
    static int hash(Object base, long offset, int length) {
        final int m = 0x5bd1e995;
        int h = 0x9747b28c ^ length;
        final int blocks = length / 4;
        for (int i = 0; i < blocks; i++) {
            final long j = offset + i * 4L;
            int k = (Platform.getByte(base, j) & 0xff) | ((Platform.getByte(base, j + 1) & 0xff) << 8)
                | ((Platform.getByte(base, j + 2) & 0xff) << 16)
                | ((Platform.getByte(base, j + 3) & 0xff) << 24);
            k *= m;
            k ^= k >>> 24;
            k *= m;
            h *= m;
            h ^= k;
        }
        final long tail = offset + blocks * 4L;
        final int rest = length & 3;
        if (rest == 3) {
            h ^= (Platform.getByte(base, tail + 2) & 0xff) << 16;
        }
        if (rest >= 2) {
            h ^= (Platform.getByte(base, tail + 1) & 0xff) << 8;
        }
        if (rest >= 1) {
            h ^= Platform.getByte(base, tail) & 0xff;
            h *= m;
        }
        h ^= h >>> 13;
        h *= m;
        h ^= h >>> 15;
        return h;
    }

    static int hash(byte[] data) {
        return hash(data, Platform.BYTE_ARRAY_OFFSET, data.length);
    }

    /** Kafka's partition for a non-empty key: the positive hash modulo the partitions. */
    static int partition(int hash, int partitions) {
        return (hash & 0x7fffffff) % partitions;
    }
}

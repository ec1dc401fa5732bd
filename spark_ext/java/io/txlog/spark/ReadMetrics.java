package io.txlog.spark;

import org.apache.hadoop.fs.ChecksumFileSystem;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.RawLocalFileSystem;

/**
 * Spark's input metrics of a task (bytes read, in the UI and to listeners) come from
 * Hadoop's file system statistics of the task's own thread. Bytes of a batch object that
 * reach the task another way (fetched ahead on another thread, or read straight from a
 * local file) are added to those statistics here, on the task's thread, so that they are
 * counted once each like the bytes Hadoop's streams read.
 */
final class ReadMetrics {
    private ReadMetrics() {
    }

    /** Whether bytes read from {@code fs} on this thread bypass its statistics (a local
     * file is read directly, see SliceReader). */
    static boolean bypassed(FileSystem fs) {
        return raw(fs) instanceof RawLocalFileSystem;
    }

    /** Counts {@code bytes} read from {@code fs} on the calling (task) thread. */
    @SuppressWarnings("deprecation")  // the per-class statistics Spark's callback sums
    static void add(FileSystem fs, long bytes) {
        FileSystem f = raw(fs);
        FileSystem.Statistics stats = FileSystem.getStatistics(f.getUri().getScheme(), f.getClass());
        stats.incrementBytesRead(bytes);
        stats.incrementReadOps(1);
    }

    private static FileSystem raw(FileSystem fs) {
        return fs instanceof ChecksumFileSystem ? ((ChecksumFileSystem) fs).getRawFileSystem() : fs;
    }
}

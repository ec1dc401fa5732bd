package io.txlog.spark;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.mapreduce.JobID;
import org.apache.hadoop.mapreduce.TaskAttemptID;
import org.apache.hadoop.mapreduce.TaskID;
import org.apache.hadoop.mapreduce.TaskType;
import org.apache.hadoop.mapreduce.task.TaskAttemptContextImpl;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.execution.datasources.OutputWriter;
import org.apache.spark.sql.execution.datasources.OutputWriterFactory;
import org.apache.spark.unsafe.types.UTF8String;

/** One task's rows, routed to one open Parquet object per topic partition. */
final class StagedWriter implements DataWriter<InternalRow> {
    /** Keyless rows go to one partition for this many rows, then the next (Kafka's sticky
     * partitioner; txlog's Python stager switches per routed chunk instead). */
    static final int STICKY_ROWS = 128 * 1024;

    static final class Staged implements WriterCommitMessage {
        private static final long serialVersionUID = 1L;
        final String lines;

        Staged(String lines) {
            this.lines = lines;
        }

        /** The lines: read through toString(), because with ``ADD JAR`` the driver may load
         * this class in another class loader than the executor that sent it. */
        @Override
        public String toString() {
            return lines;
        }

        /** The staged-object lines of a job's or micro-batch's successful tasks, joined. */
        static String joined(WriterCommitMessage[] messages) {
            StringBuilder staged = new StringBuilder();
            for (WriterCommitMessage m : messages) {
                if (m != null) {
                    staged.append(m);  // see toString
                }
            }
            return staged.toString();
        }
    }

    private final StagedWriteProvider.Spec spec;
    private final OutputWriterFactory files;
    private final TaskAttemptContextImpl context;
    private final int task;
    private final long taskId;
    private final StoredRow stored;
    /** The written rows seen as key, value[, timestamp][, partition] (null: they are). */
    private final InputColumns input;

    private final OutputWriter[] open;
    private final String[] openName;
    private final int[] openSeq;
    private final long[] rows;
    private final long[] bytes;
    private final long[] tsMin;
    private final long[] tsMax;
    /** Some rows of the open file have no timestamp of their own. */
    private final boolean[] untimed;
    private int seq;
    private int sticky;
    private int keyless;
    private final StringBuilder done = new StringBuilder();
    private final List<String> written = new ArrayList<>();

    StagedWriter(StagedWriteProvider.Spec spec, OutputWriterFactory files, Configuration conf,
                 int task, long taskId) {
        this.spec = spec;
        this.stored = new StoredRow(spec.strings);
        int pc = spec.partitionColumn;
        this.input = spec.ordinals == null ? null
            : new InputColumns(spec.ordinals, pc, spec.partitionWidth);
        this.files = files;
        this.task = task;
        this.taskId = taskId;
        TaskAttemptID attempt = new TaskAttemptID(
            new TaskID(new JobID("txlog", 0), TaskType.MAP, task), (int) taskId);
        // This task's own copy, loading classes as this class was loaded: Hadoop then finds
        // LocalFiles (fs.file.impl) whichever loader the broadcast configuration had.
        Configuration own = new Configuration(conf);
        own.setClassLoader(StagedWriter.class.getClassLoader());
        this.context = new TaskAttemptContextImpl(own, attempt);
        int n = spec.partitions;
        this.open = new OutputWriter[n];
        this.openName = new String[n];
        this.openSeq = new int[n];
        this.rows = new long[n];
        this.bytes = new long[n];
        this.tsMin = new long[n];
        this.tsMax = new long[n];
        this.untimed = new boolean[n];
        this.sticky = task % n;
    }

    @Override
    public void write(InternalRow written) throws IOException {
        InternalRow row = input == null ? written : input.of(written);
        int p = route(row);
        if (open[p] == null) {
            openFile(p);
        }
        open[p].write(stored.of(row));
        rows[p]++;
        // The rows' size in memory, as txlog's Python stager measures its buffers.
        bytes[p] += row instanceof UnsafeRow ? ((UnsafeRow) row).getSizeInBytes()
            : 16 + size(row, 0) + size(row, 1);
        int t = spec.timestampColumn;
        if (t < 0 || row.isNullAt(t)) {
            untimed[p] = true;
        } else {
            long ms = Math.floorDiv(row.getLong(t), 1000L);
            if (ms < tsMin[p]) {
                tsMin[p] = ms;
            }
            if (ms > tsMax[p]) {
                tsMax[p] = ms;
            }
        }
        if (bytes[p] >= spec.fileBytes) {
            closeFile(p);
        }
    }

    private int size(InternalRow row, int i) {
        if (row.isNullAt(i)) {
            return 0;
        }
        return spec.strings[i] ? row.getUTF8String(i).numBytes() : row.getBinary(i).length;
    }

    /** The row's partition: its partition column, else Kafka's murmur2 of its key, else
     * the sticky partition. */
    private int route(InternalRow row) {
        int n = spec.partitions;
        int pc = spec.partitionColumn;
        if (pc >= 0 && !row.isNullAt(pc)) {
            long p = spec.partitionLong ? row.getLong(pc) : row.getInt(pc);
            if (p < 0 || p >= n) {
                throw new IllegalArgumentException(
                    "txlog: topic '" + spec.topic + "' has partitions 0.." + (n - 1) + ", not "
                        + p + " (from the 'partition' column)");
            }
            return (int) p;
        }
        if (spec.keyed && n > 1 && !row.isNullAt(0)) {
            int hash = 0;
            int length;
            if (spec.strings[0]) {
                UTF8String k = row.getUTF8String(0);
                length = k.numBytes();
                if (length > 0) {
                    hash = Murmur2.hash(k.getBaseObject(), k.getBaseOffset(), length);
                }
            } else if (row instanceof UnsafeRow) {
                // The key's bytes in place: getBinary would copy them for every row.
                UnsafeRow u = (UnsafeRow) row;
                long offsetAndSize = u.getLong(0);
                length = (int) offsetAndSize;
                if (length > 0) {
                    hash = Murmur2.hash(u.getBaseObject(),
                                        u.getBaseOffset() + (offsetAndSize >>> 32), length);
                }
            } else {
                byte[] k = row.getBinary(0);
                length = k.length;
                if (length > 0) {
                    hash = Murmur2.hash(k);
                }
            }
            if (length > 0) {
                return Murmur2.partition(hash, n);
            }
        }
        int p = sticky;
        if (++keyless >= STICKY_ROWS) {
            keyless = 0;
            sticky = (sticky + 1) % n;
        }
        return p;
    }

    private OutputWriter openFile(int p) {
        String tail = spec.staging.length() > 12
            ? spec.staging.substring(spec.staging.length() - 12) : spec.staging;
        String name = String.format("p%05d-t%05d-%d-%04d-%s.parquet", p, task, taskId, seq, tail);
        seq++;
        written.add(spec.prefixUrl + name);
        OutputWriter w = files.newInstance(spec.prefixUrl + name, spec.data, context);
        open[p] = w;
        openName[p] = name;
        openSeq[p] = seq - 1;
        rows[p] = 0;
        bytes[p] = 0;
        tsMin[p] = Long.MAX_VALUE;
        tsMax[p] = Long.MIN_VALUE;
        untimed[p] = false;
        return w;
    }

    private void closeFile(int p) throws IOException {
        OutputWriter w = open[p];
        open[p] = null;
        w.close();
        Path path = new Path(spec.prefixUrl + openName[p]);
        long size;
        if (spec.fsync) {
            // A local store's objects are on disk before the log may reference them, as
            // txlog's local store writes them (Hadoop's local file system never syncs).
            try (FileChannel ch = FileChannel.open(Paths.get(path.toUri()),
                                                   StandardOpenOption.WRITE)) {
                ch.force(true);
                size = ch.size();
            }
        } else {
            FileSystem fs = path.getFileSystem(context.getConfiguration());
            size = fs.getFileStatus(path).getLen();
        }
        boolean hasTs = tsMin[p] <= tsMax[p];
        // topic, partition, key, rows, bytes, ts min, ts max (both empty: none), task,
        // sequence, and 1 when some rows have no timestamp
        done.append(spec.topic).append('\t').append(p).append('\t')
            .append(spec.prefixKey).append(openName[p]).append('\t')
            .append(rows[p]).append('\t').append(size).append('\t')
            .append(hasTs ? Long.toString(tsMin[p]) : "").append('\t')
            .append(hasTs ? Long.toString(tsMax[p]) : "").append('\t')
            .append(task).append('\t').append(openSeq[p]).append('\t')
            .append(untimed[p] ? 1 : 0).append('\n');
    }

    @Override
    public WriterCommitMessage commit() throws IOException {
        for (int p = 0; p < open.length; p++) {
            if (open[p] != null) {
                closeFile(p);
            }
        }
        if (spec.fsync && done.length() > 0) {
            // The files' names in the staging folder, and the folders Hadoop may have just
            // created on the way to it, up to and including the store's root (a fresh root's
            // first write may create "topics" itself).
            java.nio.file.Path dir = Paths.get(new Path(spec.prefixUrl).toUri());
            int depth = spec.prefixKey.split("/").length;
            for (int i = 0; i <= depth && dir != null; i++, dir = dir.getParent()) {
                try (FileChannel ch = FileChannel.open(dir, StandardOpenOption.READ)) {
                    ch.force(true);
                }
            }
        }
        failPoint();
        return new Staged(done.toString());
    }

    /** Test hook, as spark_ext/writer.py's: TXLOG_TEST_FAIL_STAGED="topic:first,t:always"
     * fails a task right after it staged its files (its first attempt, or every one). */
    private void failPoint() throws IOException {
        String raw = System.getenv("TXLOG_TEST_FAIL_STAGED");
        if (raw == null || raw.isEmpty()) {
            return;
        }
        TaskContext tc = TaskContext.get();
        int attempt = tc == null ? 0 : tc.attemptNumber();
        for (String item : raw.split(",")) {
            String[] tm = item.trim().split(":", 2);
            if (tm.length == 2 && tm[0].equals(spec.topic)
                && ("always".equals(tm[1]) || ("first".equals(tm[1]) && attempt == 0))) {
                throw new IOException("TXLOG_TEST_FAIL_STAGED: task attempt " + attempt
                                      + " fails after staging");
            }
        }
    }

    @Override
    public void abort() throws IOException {
        for (int p = 0; p < open.length; p++) {
            if (open[p] != null) {
                try {
                    open[p].close();
                } catch (RuntimeException e) {
                    // Closing a half-written file may fail; it is deleted below.
                }
                open[p] = null;
            }
        }
        for (String f : written) {
            Path path = new Path(f);
            path.getFileSystem(context.getConfiguration()).delete(path, false);
        }
    }

    @Override
    public void close() {
    }
}

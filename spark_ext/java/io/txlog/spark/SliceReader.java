package io.txlog.spark;

import java.io.EOFException;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.util.List;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFileSystem;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.mapred.FileSplit;
import org.apache.hadoop.mapreduce.TaskAttemptID;
import org.apache.hadoop.mapreduce.task.TaskAttemptContextImpl;
import org.apache.parquet.HadoopReadOptions;
import org.apache.parquet.ParquetReadOptions;
import org.apache.parquet.hadoop.ParquetFileReader;
import org.apache.parquet.hadoop.metadata.BlockMetaData;
import org.apache.parquet.hadoop.metadata.ParquetMetadata;
import org.apache.parquet.hadoop.util.HadoopInputFile;
import org.apache.parquet.io.InputFile;
import org.apache.parquet.io.SeekableInputStream;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.unsafe.types.UTF8String;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Option;

/**
 * Reads one input partition's slices in order. Each batch it returns is a view: stored
 * columns are the Parquet reader's own vectors (shifted when a slice starts inside a batch),
 * derived columns are computed per row on access.
 */
final class SliceReader implements PartitionReader<ColumnarBatch> {
    private static final Logger LOG = LoggerFactory.getLogger(SliceReader.class);

    private final SlicePartition part;
    private final List<OutputColumn> columns;
    private final List<String> storedNames;
    private final int batchSize;
    private final boolean failOnDataLoss;
    private final Configuration conf;
    private TaskAttemptContextImpl context;  // for Spark's Parquet reader, made when it is

    private int slice = -1;
    private long pos;          // next row of the object to return
    private long end;          // end of the current slice (exclusive)
    private final int capacity;  // rows of the reader's vectors, whatever an object's size
    private ReusedReader file;
    private String filePath;   // the object file reads
    private long fileRows;     // rows in that object (its footer's)
    private ParquetReadOptions readOptions;
    private SharedCodecs codecs;  // readOptions' codecs, released when the partition is read
    private FileSystem fs;     // the file system of the objects read (one root per read)
    private SignedGet signed;  // fs's bucket's signed GETs, if its settings allow; else null
    private int readersOpened;
    private String footerPath; // the object whose row count footerRows is
    private long footerRows;
    private long batchStart;   // object row of the file reader's current batch's first row
    private int batchRows;
    private ColumnarBatch current;
    private ObjectPrefetch prefetch;  // set up at the first object read whole; null: none
    private boolean prefetchChecked;
    /** The stored columns' Spark schema where txlog's own decoder reads objects read whole
     * (a Kafka-shaped topic's columns, not turned off), else null. */
    private final org.apache.spark.sql.types.StructType directSchema;
    private DirectObject direct;  // the current object, where txlog's decoder read it
    private int directGroup;      // its row group that is the current batch
    private boolean fileDrained;  // the file reader has returned every row of its object
    private int decodedDirectly;
    private int decodedByParquet;
    /** Objects read whole from the store and their pages decoded by txlog's decoder. */
    private final ReadBuffers buffers = new ReadBuffers();

    SliceReader(SlicePartition part, List<OutputColumn> columns, int batchSize,
                boolean failOnDataLoss, Configuration conf) {
        this.failOnDataLoss = failOnDataLoss;
        // Spark's Parquet reader's task context copies every setting: made only where an
        // object goes to that reader (txlog's decoder reads the settings as they are).
        this.conf = conf;
        this.part = part;
        this.columns = columns;
        this.storedNames = OutputColumn.storedNames(columns);
        this.batchSize = batchSize;
        long rows = 1;
        for (int i = 0; i < part.size(); i++) {
            rows = Math.max(rows, part.skips[i] + part.takes[i]);
        }
        this.capacity = (int) Math.min(batchSize, rows);
        String decoder = conf.get(DirectObject.DECODER, "txlog");
        if (!decoder.equals("txlog") && !decoder.equals("parquet")) {
            throw new IllegalArgumentException("txlog: " + DirectObject.DECODER + " is '"
                + decoder + "'; set it to 'txlog' (txlog's own decoder, the default) or "
                + "'parquet' (Spark's Parquet reader for every object)");
        }
        org.apache.spark.sql.types.StructType stored = OutputColumn.storedSchema(columns);
        this.directSchema = decoder.equals("txlog") && DirectObject.handles(stored)
            ? stored : null;
    }

    /** Objects whose rows txlog's own decoder read, and those Spark's Parquet reader read
     * (for tests). */
    int objectsDecodedDirectly() {
        return decodedDirectly;
    }

    int objectsDecodedByParquet() {
        return decodedByParquet;
    }

    /** How many Parquet readers were set up (objects not carried on to by the last). */
    int readersOpened() {
        return readersOpened;
    }

    /** The most rows any of the reader's column vectors holds (bounded by the scan's batch
     * size, whatever an object's size); 0 while no object is open. */
    int vectorCapacity() throws ReflectiveOperationException {
        // Spark keeps a vector's capacity to itself; this is for tests only.
        java.lang.reflect.Field capacityOf =
            WritableColumnVector.class.getDeclaredField("capacity");
        capacityOf.setAccessible(true);
        int most = 0;
        if (file != null) {
            ColumnarBatch b = file.resultBatch();
            for (int i = 0; i < b.numCols(); i++) {
                if (b.column(i) instanceof WritableColumnVector) {
                    most = Math.max(most, capacityOf.getInt(b.column(i)));
                }
            }
        }
        return most;
    }

    @Override
    public boolean next() throws IOException {
        while (slice < 0 || pos >= end) {
            slice++;
            if (slice >= part.size()) {
                closeFile();
                return false;
            }
            pos = part.skips[slice];
            end = pos + part.takes[slice];
            if (pos >= end) {
                continue;
            }
            // The runs of a compacted segment are consecutive slices of one object: read on
            // from the current batch instead of reopening it and decoding from row 0.
            boolean readOn = (file != null || direct != null)
                && part.paths[slice].equals(filePath) && pos >= batchStart;
            if (!readOn) {
                if (!openFile()) {
                    pos = end;  // gone, and failOnDataLoss=false: skipped, as format("txlog") does
                }
            }
        }
        if (storedNames.isEmpty()) {  // nothing stored is read: the footer vouched for the rows
            int rows = (int) Math.min(batchSize, end - pos);
            current = assemble(null, 0, rows);
            pos += rows;
            return true;
        }
        while (batchStart + batchRows <= pos) {
            batchStart += batchRows;
            if (!nextFileBatch()) {
                throw ObjectErrors.truncated(part.paths[slice], batchStart, end);
            }
        }
        int offset = (int) (pos - batchStart);
        // A row group decoded by txlog's decoder may hold more rows than a batch.
        int rows = (int) Math.min(Math.min(batchRows - offset, end - pos), batchSize);
        current = assemble(direct != null ? directBatch() : file.resultBatch(), offset, rows);
        pos += rows;
        return true;
    }

    /** The current row group of the object txlog's decoder reads, decoded (row groups a
     * slice starts beyond are passed over undecoded). */
    private ColumnarBatch directBatch() throws IOException {
        try {
            return direct.group(directGroup);
        } catch (CompactReader.Damaged | PageDecoder.Unsupported | RuntimeException e) {
            throw unreadable(e);  // its checksum held: opening it checked that
        }
    }

    private boolean nextFileBatch() throws IOException {
        if (direct != null) {
            if (directGroup + 1 >= direct.groupCount()) {
                return false;
            }
            batchRows = direct.groupRows(++directGroup);
            return true;
        }
        try {
            if (!file.nextBatch()) {
                return false;
            }
        } catch (IOException | RuntimeException e) {
            throw unreadable(e);
        }
        batchRows = file.resultBatch().numRows();
        return true;
    }

    /**
     * Opens the current slice's object; false if it is gone and may be skipped. A query of
     * derived columns alone reads only the footer: it still finds a missing object
     * (failOnDataLoss) and one with fewer rows than planned, as Spark's Parquet count does.
     * Either way the object is opened at the size its log entry declares, without looking
     * it up first (one request fewer per object on a remote store); an object of another
     * size fails to open and is then reported as truncated or replaced.
     */
    private boolean openFile() throws IOException {
        Path path = new Path(part.paths[slice]);
        if (storedNames.isEmpty()) {
            if (!part.paths[slice].equals(footerPath)) {  // a segment's runs share one footer
                Opened o;
                try {
                    o = open(path, conf, false);
                } catch (FileNotFoundException e) {
                    return gone(e);
                }
                o.stream.close();
                footerRows = 0;
                for (BlockMetaData block : o.footer.getBlocks()) {
                    footerRows += block.getRowCount();
                }
                footerPath = part.paths[slice];
            }
            if (footerRows < end) {
                throw ObjectErrors.truncated(part.paths[slice], footerRows, end);
            }
            return true;
        }
        if (direct == null && file != null) {  // leaving an object the file reader read
            fileDrained = batchStart + batchRows == fileRows;
        }
        Opened o;
        try {
            o = open(path, conf, true);
        } catch (FileNotFoundException e) {
            closeFile();
            direct = null;
            return gone(e);
        } catch (IOException | RuntimeException e) {
            closeFile();
            direct = null;
            throw e;
        }
        if (o.direct != null) {  // the file reader, if any, stays for objects it reads
            decodedDirectly++;
            direct = o.direct;
            directGroup = -1;
            startObject(o);
            return true;
        }
        direct = null;
        decodedByParquet++;
        // A reader that has returned every row of its object goes on to the next one (of
        // the same schema) with its vectors and set-up: objects are often a few hundred rows.
        boolean drained = file != null && fileDrained;
        if (drained && o.whole != null) {
            boolean carried;
            try {
                carried = file.carryOn(path, o.whole, o.footer, readOptions(path, conf));
            } catch (IOException | RuntimeException e) {
                o.stream.close();
                closeFile();
                throw unreadable(e);
            }
            if (carried) {
                o.stream.close();
                startObject(o);
                return true;
            }
        }
        closeFile();
        ReusedReader reader = new ReusedReader(capacity);
        readersOpened++;
        // The split covers the whole object (row groups are picked by their midpoint).
        FileSplit split = new FileSplit(path, 0, Long.MAX_VALUE, (String[]) null);
        if (context == null) {
            context = new TaskAttemptContextImpl(conf, new TaskAttemptID());
        }
        try {
            try {
                reader.initialize(split, context, Option.apply(o.file(conf)), Option.apply(o.stream),
                                  Option.apply(o.footer));
            } catch (NoSuchMethodError e) {  // a Spark without it: the reader opens the object
                o.stream.close();
                reader.initialize(split, context);
            }
            // Allocates the batch nextBatch() fills, with the topic's types: an object whose
            // columns do not convert to them fails in nextBatch(), named by unreadable().
            reader.resultBatch();
        } catch (IOException | InterruptedException | RuntimeException e) {
            reader.close();
            throw unreadable(e);
        }
        file = reader;
        startObject(o);
        return true;
    }

    private void startObject(Opened o) {
        filePath = part.paths[slice];
        fileRows = 0;
        if (o.direct != null) {
            fileRows = o.direct.rows();
        } else {
            for (BlockMetaData block : o.footer.getBlocks()) {
                fileRows += block.getRowCount();
            }
        }
        batchStart = 0;
        batchRows = 0;
    }

    private ParquetReadOptions readOptions(Path path, Configuration conf) {
        if (readOptions == null) {
            ParquetReadOptions plain = HadoopReadOptions.builder(conf, path).build();
            codecs = new SharedCodecs(plain.getCodecFactory());
            readOptions = HadoopReadOptions.builder(conf, path).withCodecFactory(codecs).build();
        }
        return readOptions;
    }

    /** How many decompressors the readers objects were handed on to set up (for tests). */
    int decompressorsSetUp() {
        return codecs == null ? 0 : codecs.decompressorsSetUp();
    }

    /** An object opened with its footer read; the stream is positioned for the rows.
     * {@code whole} holds the object's bytes where it was read whole, else null. Where
     * txlog's decoder read the object, {@code direct} has its rows (and nothing else is set). */
    private static final class Opened {
        final Path path;
        final FileStatus status;  // null: the size is not known
        final ObjectBytes whole;
        final SeekableInputStream stream;
        final ParquetMetadata footer;
        final DirectObject direct;

        Opened(Path path, FileStatus status, ObjectBytes whole, SeekableInputStream stream,
               ParquetMetadata footer) {
            this.path = path;
            this.status = status;
            this.whole = whole;
            this.stream = stream;
            this.footer = footer;
            this.direct = null;
        }

        Opened(Path path, DirectObject direct) {
            this.path = path;
            this.status = null;
            this.whole = null;
            this.stream = null;
            this.footer = null;
            this.direct = direct;
        }

        HadoopInputFile file(Configuration conf) throws IOException {
            return status != null ? HadoopInputFile.fromStatus(status, conf)
                : HadoopInputFile.fromPath(path, conf);
        }
    }

    /**
     * Opens the current slice's object at the size its log entry declares. An object read
     * for its rows and no larger than {@link #WHOLE_MAX} is read whole in one request and
     * checked against the CRC-32 its key names; others are streamed, unchecked.
     */
    private Opened open(Path path, Configuration conf, boolean rowsToo) throws IOException {
        long declared = part.objectBytes[slice];
        FileStatus status = declared > 0 ? new FileStatus(declared, false, 1, 0, 0, path) : null;
        ObjectBytes whole = null;
        Object client = null;  // what read the object, where it may be kept in memory
        boolean known = false;  // its bytes came from memory
        InputFile in;
        SeekableInputStream stream;
        try {
            if (rowsToo && declared > 0 && declared <= WHOLE_MAX) {
                byte[] fetched = prefetched(path, conf);
                FileSystem fsys = fileSystem(path, conf);
                int length = (int) declared;
                String object = part.paths[slice];
                client = RecentObjects.clientFor(fsys, signed, object, conf);
                byte[] bytes = fetched != null || client == null ? fetched
                    : RecentObjects.SHARED.get(client, object, length, conf);
                known = bytes != null && client != null
                    && RecentObjects.SHARED.holds(client, object, bytes);
                if (bytes == null) {
                    // Objects txlog's decoder may read are read into the task's array for
                    // them, unless they are kept after this read.
                    bytes = WholeObjects.read(fsys, signed, path, status,
                        directSchema != null && client == null ? buffers.object(length) : null);
                } else if (fetched == null) {
                    fetched = bytes;  // from memory: counted below as fetched ahead are
                }
                if (fetched != null || signed != null || ReadMetrics.bypassed(fsys)) {
                    ReadMetrics.add(fsys, length);  // Spark's bytes read see them
                }
                whole = known ? ObjectBytes.checked(bytes, length) : new ObjectBytes(bytes, length);
                if (directSchema != null) {
                    DirectObject d = ObjectErrors.decodeDirectly(
                        object, path, conf, declared, whole, directSchema, buffers);
                    if (d != null) {
                        RecentObjects.keep(client, object, whole, known, conf);
                        return new Opened(path, d);
                    }
                }
                if (bytes.length != length || bytes == buffers.object(0)) {
                    // Spark's reader may read it after the next object is read: its own copy.
                    whole = new ObjectBytes(java.util.Arrays.copyOf(bytes, length));
                }
                in = whole;
            } else {
                in = status != null ? HadoopInputFile.fromStatus(status, conf)
                    : HadoopInputFile.fromPath(path, conf);
            }
            stream = in.newStream();
        } catch (FileNotFoundException | ObjectErrors.DecodeFailure | RecentObjects.BadSetting e) {
            throw e;
        } catch (EOFException e) {  // shorter than declared
            throw openFailure(path, conf, declared, null, e);
        } catch (IOException | RuntimeException e) {
            throw unreadable(e);
        }
        try {
            ParquetMetadata footer = ParquetFileReader.readFooter(in, readOptions(path, conf),
                                                                  stream);
            if (whole != null) {
                whole.verify(part.paths[slice]);
                RecentObjects.keep(client, part.paths[slice], whole, known, conf);
            }
            return new Opened(path, status, whole, stream, footer);
        } catch (IOException | RuntimeException e) {
            stream.close();
            throw openFailure(path, conf, declared, whole, e);
        }
    }

    /** An object of at most this many bytes is read whole: one request instead of one for
     * its footer and one or more for its columns (it is held while its rows are read). */
    static final long WHOLE_MAX = 8L << 20;

    /** Objects a task reads whole that are fetched ahead of it (0: none), and the most bytes
     * of them held ahead (beyond the next one). */
    static final String PREFETCH_OBJECTS = "txlog.scan.prefetch.objects";
    static final String PREFETCH_BYTES = "txlog.scan.prefetch.bytes";
    /** Whether objects on local disk are fetched ahead too (off by default: there a read
     * takes microseconds, and fetching ahead showed no gain in spark_scan.py). */
    static final String PREFETCH_LOCAL = "txlog.scan.prefetch.local";

    /**
     * The current slice's object as fetched ahead, or null where it was not (the caller
     * reads it). At the first object read whole, starts fetching the partition's objects
     * read whole on other threads, unless they are on local disk (see PREFETCH_LOCAL).
     */
    private byte[] prefetched(Path path, Configuration conf) throws IOException {
        if (!prefetchChecked) {
            prefetchChecked = true;
            int objects = conf.getInt(PREFETCH_OBJECTS, 8);
            FileSystem fsys = fileSystem(path, conf);
            boolean local = fsys instanceof ChecksumFileSystem
                ? ((ChecksumFileSystem) fsys).getRawFileSystem() instanceof RawLocalFileSystem
                : fsys instanceof RawLocalFileSystem;
            if (objects > 0 && (!local || conf.getBoolean(PREFETCH_LOCAL, false))) {
                prefetch = startPrefetch(fsys, objects, conf.getLong(PREFETCH_BYTES, 32L << 20));
            }
        }
        return prefetch != null ? prefetch.take(slice) : null;
    }

    /** Fetches ahead the objects of the slices read whole that open an object (the further
     * runs of a compacted segment are read on from the reader that has it). */
    private ObjectPrefetch startPrefetch(FileSystem fsys, int objects, long bytes) {
        SignedGet rootGet = signed;
        int[] slices = new int[part.size()];
        long[] sizes = new long[part.size()];
        int n = 0;
        for (int i = 0; i < part.size(); i++) {
            long declared = part.objectBytes[i];
            boolean opens = i == 0 || !part.paths[i].equals(part.paths[i - 1]);
            if (part.takes[i] > 0 && declared > 0 && declared <= WHOLE_MAX && opens) {
                slices[n] = i;
                sizes[n++] = declared;
            }
        }
        java.net.URI root = fsys.getUri();
        return new ObjectPrefetch(java.util.Arrays.copyOf(slices, n),
                                  java.util.Arrays.copyOf(sizes, n), objects, bytes, i -> {
            Path p = new Path(part.paths[i]);
            java.net.URI u = p.toUri();
            // One root per read: its file system, else (another store) that store's.
            boolean atRoot = java.util.Objects.equals(u.getScheme(), root.getScheme())
                && java.util.Objects.equals(u.getAuthority(), root.getAuthority());
            FileSystem f = atRoot ? fsys : ObjectFileSystems.forWholeReads(p, conf);
            SignedGet g = atRoot ? rootGet : ObjectFileSystems.signedGet(p, conf);
            long declared = part.objectBytes[i];
            Object client = RecentObjects.clientFor(f, g, part.paths[i], conf);
            byte[] kept = client == null ? null  // no request for what is in memory
                : RecentObjects.SHARED.get(client, part.paths[i], (int) declared, conf);
            if (kept != null) {
                return kept;
            }
            return WholeObjects.read(f, g, p, new FileStatus(declared, false, 1, 0, 0, p));
        });
    }

    private FileSystem fileSystem(Path path, Configuration conf) throws IOException {
        java.net.URI u = path.toUri();
        if (fs == null || !java.util.Objects.equals(u.getScheme(), fs.getUri().getScheme())
            || !java.util.Objects.equals(u.getAuthority(), fs.getUri().getAuthority())) {
            fs = ObjectFileSystems.forWholeReads(path, conf);
            signed = ObjectFileSystems.signedGet(path, conf);
        }
        return fs;
    }

    /** The current slice's object is gone: fail, or (failOnDataLoss=false) say false. */
    private boolean gone(FileNotFoundException e) throws IOException {
        String what = "txlog: batch object " + part.paths[slice] + " of " + part.topics[slice]
            + "-" + part.partitions[slice] + " (offsets " + (part.bases[slice] + part.skips[slice])
            + ".." + (part.bases[slice] + part.skips[slice] + part.takes[slice] - 1)
            + ") is gone: retention or compaction deleted it after the read was planned.";
        if (failOnDataLoss) {
            throw new IOException(what + " Re-run the query, or set failOnDataLoss=false "
                + "to skip missing data.", e);
        }
        LOG.warn(what + " Skipped (failOnDataLoss=false).");
        return false;
    }

    private IOException unreadable(Exception e) {
        return ObjectErrors.unreadable(part.paths[slice], e);
    }

    private IOException openFailure(Path path, Configuration conf, long declared,
                                    ObjectBytes whole, Exception e) throws IOException {
        return ObjectErrors.openFailure(part.paths[slice], path, conf, declared, whole, e);
    }

    private ColumnarBatch assemble(ColumnarBatch data, int offset, int rows) {
        ColumnVector[] out = new ColumnVector[columns.size()];
        long firstRow = pos;
        for (int i = 0; i < out.length; i++) {
            OutputColumn c = columns.get(i);
            ColumnVector stored = c.stored < 0 ? null
                : Vectors.shift(data.column(c.stored), offset, rows);
            switch (c.source) {
                case STORED:
                    out[i] = stored;
                    break;
                case TOPIC:
                    out[i] = new Vectors.ConstString(c.type, UTF8String.fromString(part.topics[slice]));
                    break;
                case PARTITION:
                    out[i] = new Vectors.ConstInt(c.type, part.partitions[slice]);
                    break;
                case OFFSET:
                    out[i] = new Vectors.LongSequence(c.type, part.bases[slice] + firstRow, 1);
                    break;
                case KAFKA_TIMESTAMP:
                    out[i] = new Vectors.LongOr(c.type, stored, part.appendMs[slice] * 1000L);
                    break;
                case TIMESTAMP_TYPE:
                    out[i] = new Vectors.NullFlag(c.type, stored);
                    break;
                case APPEND_TIME:
                    out[i] = new Vectors.LongSequence(c.type, part.appendMs[slice] * 1000L, 0);
                    break;
                default:
                    throw new IllegalStateException(c.source.toString());
            }
        }
        return new ColumnarBatch(out, rows);
    }

    @Override
    public org.apache.spark.sql.connector.metric.CustomTaskMetric[] currentMetricsValues() {
        return DecoderMetrics.values(decodedDirectly, decodedByParquet);
    }

    @Override
    public ColumnarBatch get() {
        return current;
    }

    private void closeFile() throws IOException {
        if (file != null) {
            ReusedReader f = file;
            file = null;
            f.close();
        }
    }

    @Override
    public void close() throws IOException {
        direct = null;
        try {
            if (prefetch != null) {
                prefetch.close();
                prefetch = null;
            }
        } finally {
            try {
                closeFile();
            } finally {
                if (codecs != null) {
                    codecs.close();
                }
            }
        }
    }
}

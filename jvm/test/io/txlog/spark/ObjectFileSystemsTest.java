package io.txlog.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.io.IOException;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.parquet.example.data.Group;
import org.apache.parquet.example.data.simple.SimpleGroupFactory;
import org.apache.parquet.hadoop.ParquetWriter;
import org.apache.parquet.hadoop.example.ExampleParquetWriter;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.MessageTypeParser;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class ObjectFileSystemsTest {
    private static final MessageType SCHEMA = MessageTypeParser.parseMessageType(
        "message m { optional binary value; }");

    /**
     * Stands in for S3A (hadoop-aws is not on the test classpath): s3a://bucket/key is the
     * file {@code root}/key, and each instance remembers the input stream type S3A would
     * have used for the bucket and how many objects were read through it.
     */
    public static final class FakeS3a extends RawLocalFileSystem {
        static volatile File root;
        static final List<FakeS3a> INSTANCES = new ArrayList<>();

        URI uri;
        String streamType;
        final AtomicInteger reads = new AtomicInteger();

        @Override
        public void initialize(URI name, Configuration conf) throws IOException {
            super.initialize(URI.create("file:///"), conf);
            uri = URI.create("s3a://" + name.getAuthority());
            streamType = conf.get("fs.s3a.bucket." + name.getAuthority() + ".input.stream.type",
                                  conf.get("fs.s3a.input.stream.type", "analytics"));
            synchronized (INSTANCES) {
                INSTANCES.add(this);
            }
        }

        @Override
        public URI getUri() {
            return uri != null ? uri : super.getUri();  // the constructor asks before it is set
        }

        @Override
        public String getScheme() {
            return "s3a";
        }

        @Override
        public File pathToFile(Path path) {
            reads.incrementAndGet();
            return new File(root, path.toUri().getPath());
        }
    }

    @TempDir
    java.nio.file.Path dir;

    private final Map<String, Long> sizes = new ConcurrentHashMap<>();

    @AfterEach
    void closeFileSystems() throws IOException {
        ObjectFileSystems.closeAll();
        FileSystem.closeAll();
        synchronized (FakeS3a.INSTANCES) {
            FakeS3a.INSTANCES.clear();
        }
    }

    private Configuration conf() {
        FakeS3a.root = dir.toFile();
        Configuration conf = new Configuration();
        conf.setClass("fs.s3a.impl", FakeS3a.class, FileSystem.class);
        conf.set("fs.s3a.bucket.bkt.access.key", "k1");
        return conf;
    }

    /** An object of {@code rows} values "name-i" at s3a://bkt/name.parquet. */
    private String write(String name, int rows) throws IOException {
        java.nio.file.Path file = dir.resolve(name + ".parquet");
        SimpleGroupFactory groups = new SimpleGroupFactory(SCHEMA);
        try (ParquetWriter<Group> w = ExampleParquetWriter.builder(new Path(file.toUri()))
                 .withConf(new Configuration()).withType(SCHEMA).build()) {
            for (int i = 0; i < rows; i++) {
                w.write(groups.newGroup().append("value", name + "-" + i));
            }
        }
        String key = "s3a://bkt/" + name + ".parquet";
        sizes.put(key, Files.size(file));
        return key;
    }

    private SliceReader reader(List<String> keys, int rows, Configuration base) {
        StructType schema = new StructType()
            .add("value", DataTypes.BinaryType).add("offset", DataTypes.LongType);
        List<OutputColumn> columns = OutputColumn.plan(schema, false);
        SlicePartition part = SlicePartition.ofSize(keys.size());
        for (int i = 0; i < keys.size(); i++) {
            part.paths[i] = keys.get(i);
            part.topics[i] = "t";
            part.bases[i] = (long) i * rows;
            part.takes[i] = rows;
            part.objectBytes[i] = sizes.get(keys.get(i));
            part.addBytes(sizes.get(keys.get(i)));
        }
        return new SliceReader(part, columns, 100, true,
                               PlannedScanProvider.readerConf(base, columns));
    }

    @Test
    void theScanReadsS3ObjectsThroughItsOwnClassicStreamFileSystem() throws Exception {
        Configuration conf = conf();
        // The user's own setting for the bucket, which their other reads keep.
        conf.set("fs.s3a.bucket.bkt.input.stream.type", "analytics");
        conf.setInt(SliceReader.PREFETCH_OBJECTS, 2);
        conf.setBoolean(SliceReader.PREFETCH_LOCAL, true);
        List<String> keys = new ArrayList<>();
        for (int o = 0; o < 6; o++) {
            keys.add(write("o" + o, 30));
        }
        List<String> values = new ArrayList<>();
        try (SliceReader r = reader(keys, 30, conf)) {
            while (r.next()) {
                ColumnarBatch b = r.get();
                for (int i = 0; i < b.numRows(); i++) {
                    values.add(new String(b.column(0).getBinary(i), StandardCharsets.UTF_8));
                }
            }
        }
        assertEquals(180, values.size());
        assertEquals("o5-29", values.get(179));
        FakeS3a shared = (FakeS3a) new Path(keys.get(0)).getFileSystem(conf);
        assertEquals("analytics", shared.streamType);
        assertEquals(0, shared.reads.get(), "objects read through the shared filesystem");
        int classicReads = 0;
        synchronized (FakeS3a.INSTANCES) {
            for (FakeS3a fs : FakeS3a.INSTANCES) {
                if (fs != shared) {
                    assertEquals("classic", fs.streamType);
                    assertTrue(ObjectFileSystems.isOwn(fs));
                    classicReads += fs.reads.get();
                }
            }
        }
        assertEquals(6, classicReads);
    }

    @Test
    void oneOwnFileSystemPerBucketAndSettings() throws Exception {
        Configuration conf = conf();
        Path a = new Path("s3a://bkt/a.parquet");
        FileSystem first = ObjectFileSystems.forWholeReads(a, conf);
        assertSame(first, ObjectFileSystems.forWholeReads(new Path("s3a://bkt/b"), conf));
        assertSame(first, ObjectFileSystems.forWholeReads(a, new Configuration(conf)));
        assertNotSame(first, a.getFileSystem(conf));
        // The caller's configuration is left as it was.
        assertNull(conf.get("fs.s3a.input.stream.type"));
        assertNull(conf.get("fs.s3a.bucket.bkt.input.stream.type"));

        Configuration rotated = new Configuration(conf);
        rotated.set("fs.s3a.bucket.bkt.access.key", "k2");
        FileSystem second = ObjectFileSystems.forWholeReads(a, rotated);
        assertNotSame(first, second);
        assertNotSame(first, ObjectFileSystems.forWholeReads(new Path("s3a://other/x"), conf));

        Configuration own = new Configuration(conf);
        own.set(ObjectFileSystems.STREAM_TYPE, "prefetch");
        assertEquals("prefetch", ((FakeS3a) ObjectFileSystems.forWholeReads(a, own)).streamType);
    }

    @Test
    void beyondTheCapReadsGoThroughTheSharedFileSystem() throws Exception {
        Configuration conf = conf();
        Path a = new Path("s3a://bkt/a.parquet");
        for (int i = 0; i < ObjectFileSystems.MAX_OWN; i++) {
            Configuration c = new Configuration(conf);
            c.set("fs.s3a.bucket.bkt.access.key", "k" + i);
            assertTrue(ObjectFileSystems.isOwn(ObjectFileSystems.forWholeReads(a, c)));
        }
        Configuration more = new Configuration(conf);
        more.set("fs.s3a.bucket.bkt.access.key", "another");
        assertSame(a.getFileSystem(more), ObjectFileSystems.forWholeReads(a, more));
    }

    @Test
    void sharedAndOtherSchemesUseHadoopsCachedFileSystem() throws Exception {
        Configuration conf = conf();
        conf.set(ObjectFileSystems.STREAM_TYPE, "shared");
        Path a = new Path("s3a://bkt/a.parquet");
        assertSame(a.getFileSystem(conf), ObjectFileSystems.forWholeReads(a, conf));
        Path local = new Path(dir.toUri());
        assertSame(local.getFileSystem(conf), ObjectFileSystems.forWholeReads(local, conf()));
    }
}

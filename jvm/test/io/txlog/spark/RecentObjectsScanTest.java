package io.txlog.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.io.IOException;
import java.net.URI;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.zip.CRC32;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;
import org.apache.parquet.example.data.Group;
import org.apache.parquet.example.data.simple.SimpleGroupFactory;
import org.apache.parquet.hadoop.ParquetWriter;
import org.apache.parquet.hadoop.example.ExampleParquetWriter;
import org.apache.parquet.hadoop.metadata.CompressionCodecName;
import org.apache.parquet.io.api.Binary;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.MessageTypeParser;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Objects kept in memory by the scan, read again by later scans through a store that is
 * not local disk: the same rows, no request, the kept bytes never changed, bytes read
 * counted once per object. */
class RecentObjectsScanTest {
    private static final MessageType KAFKA = MessageTypeParser.parseMessageType(
        "message spark_schema { optional binary key; optional binary value;"
            + " optional int64 timestamp (TIMESTAMP(MILLIS,true)); }");
    private static final StructType READ = new StructType()
        .add("key", DataTypes.BinaryType).add("value", DataTypes.BinaryType)
        .add("offset", DataTypes.LongType);

    /** A store that is not local disk to the scan: rmt://bucket/key is {@code root}/key. */
    public static final class Remote extends FileSystem {
        static volatile File root;
        static final AtomicInteger OPENS = new AtomicInteger();

        private URI uri;
        private final RawLocalFileSystem local = new RawLocalFileSystem();

        @Override
        public void initialize(URI name, Configuration conf) throws IOException {
            super.initialize(name, conf);
            uri = URI.create("rmt://" + name.getAuthority());
            local.initialize(URI.create("file:///"), conf);
        }

        private static Path onDisk(Path p) {
            return new Path(new File(root, p.toUri().getPath()).toURI());
        }

        @Override
        public URI getUri() {
            return uri;
        }

        @Override
        public String getScheme() {
            return "rmt";
        }

        @Override
        public FSDataInputStream open(Path f, int bufferSize) throws IOException {
            OPENS.incrementAndGet();
            return local.open(onDisk(f), bufferSize);
        }

        @Override
        public FileStatus getFileStatus(Path f) throws IOException {
            return new FileStatus(local.getFileStatus(onDisk(f)).getLen(), false, 1, 0, 0, f);
        }

        @Override
        public FSDataOutputStream create(Path f, FsPermission p, boolean o, int b, short r,
                                         long s, Progressable pr) {
            throw new UnsupportedOperationException();
        }

        @Override
        public FSDataOutputStream append(Path f, int b, Progressable p) {
            throw new UnsupportedOperationException();
        }

        @Override
        public boolean rename(Path a, Path b) {
            throw new UnsupportedOperationException();
        }

        @Override
        public boolean delete(Path f, boolean r) {
            throw new UnsupportedOperationException();
        }

        @Override
        public FileStatus[] listStatus(Path f) {
            throw new UnsupportedOperationException();
        }

        @Override
        public void setWorkingDirectory(Path d) {
        }

        @Override
        public Path getWorkingDirectory() {
            return new Path(uri);
        }

        @Override
        public boolean mkdirs(Path f, FsPermission p) {
            throw new UnsupportedOperationException();
        }
    }

    @TempDir
    java.nio.file.Path dir;

    @AfterEach
    void forget() throws IOException {
        RecentObjects.SHARED.clear();
        FileSystem.closeAll();
    }

    private static String hex(byte[] b) {
        StringBuilder s = new StringBuilder();
        for (byte x : b) {
            s.append(String.format("%02x", x));
        }
        return s.toString();
    }

    /** Writes an object of random records under its checksummed name; returns its slice
     * (key, base, skip, take, bytes) and adds the rows it must read as to {@code want}. */
    private String[] object(String name, int rows, Random rng, long base, int skip, int take,
                            List<String> want) throws IOException {
        java.nio.file.Path tmp = dir.resolve(name + ".tmp");
        boolean dictionary = rng.nextBoolean();
        CompressionCodecName codec = rng.nextBoolean() ? CompressionCodecName.SNAPPY
            : CompressionCodecName.UNCOMPRESSED;
        SimpleGroupFactory groups = new SimpleGroupFactory(KAFKA);
        try (ParquetWriter<Group> w = ExampleParquetWriter.builder(new Path(tmp.toUri()))
                 .withConf(new Configuration()).withType(KAFKA).withCompressionCodec(codec)
                 .withDictionaryEncoding(dictionary).build()) {
            for (int i = 0; i < rows; i++) {
                Group g = groups.newGroup();
                String key = "k" + rng.nextInt(20);
                byte[] value = new byte[rng.nextInt(100)];
                rng.nextBytes(value);
                g.append("key", key).append("value", Binary.fromConstantByteArray(value))
                    .append("timestamp", 1_700_000_000_000L);
                w.write(g);
                if (i >= skip && i < skip + take) {
                    want.add(hex(key.getBytes()) + "|" + hex(value) + "|" + (base + i));
                }
            }
        }
        byte[] data = Files.readAllBytes(tmp);
        CRC32 crc = new CRC32();
        crc.update(data);
        String file = String.format("%s.crc32-%08x.parquet", name, crc.getValue());
        Files.move(tmp, dir.resolve(file));
        return new String[] {"rmt://bkt/" + file, Long.toString(base), Integer.toString(skip),
                             Integer.toString(take), Integer.toString(data.length)};
    }

    private Configuration base(String decoder) {
        Remote.root = dir.toFile();
        Configuration c = new Configuration();
        c.setClass("fs.rmt.impl", Remote.class, FileSystem.class);
        c.set(DirectObject.DECODER, decoder);
        // Kept for ten minutes: a slow machine's passes still find what the first one kept.
        c.setLong(RecentObjects.IDLE_MS, 600_000);
        return c;
    }

    private static SliceReader reader(List<String[]> slices, int batchSize, Configuration base) {
        return TestSlices.reader(slices, batchSize, base, READ, 1_700_000_000_000L);
    }

    private static List<String> rows(SliceReader r) throws IOException {
        List<String> out = new ArrayList<>();
        while (r.next()) {
            ColumnarBatch b = r.get();
            for (int i = 0; i < b.numRows(); i++) {
                out.add(hex(b.column(0).getBinary(i)) + "|" + hex(b.column(1).getBinary(i)) + "|"
                        + b.column(2).getLong(i));
            }
        }
        return out;
    }

    @SuppressWarnings("deprecation")
    private static long bytesReadOnThisThread() {
        return FileSystem.getStatistics("rmt", Remote.class).getThreadStatistics().getBytesRead();
    }

    /** Every kept object still matches the checksum its key names. */
    private static int keptAndIntact(List<String[]> slices, Configuration conf) {
        int kept = 0;
        for (String[] s : slices) {
            int length = Integer.parseInt(s[4]);
            Object client = null;
            try {
                client = new Path(s[0]).getFileSystem(conf);
            } catch (IOException e) {
                throw new AssertionError(e);
            }
            byte[] b = RecentObjects.SHARED.get(client, s[0], length, conf);
            if (b != null) {
                CRC32 crc = new CRC32();
                crc.update(b, 0, length);
                assertEquals(ObjectBytes.expectedCrc(s[0]), crc.getValue(), s[0]);
                kept++;
            }
        }
        return kept;
    }

    private List<String[]> objects(long seed, int n, List<String> want) throws IOException {
        System.out.println("recent objects scan, seed " + seed);
        Random rng = new Random(seed);
        List<String[]> slices = new ArrayList<>();
        long base = 0;
        for (int o = 0; o < n; o++) {
            int rows = 1 + rng.nextInt(rng.nextBoolean() ? 300 : 3000);
            int skip = rng.nextInt(3) == 0 ? rng.nextInt(rows) : 0;
            int take = rows - skip - (rng.nextInt(3) == 0 ? rng.nextInt(rows - skip) : 0);
            slices.add(object("o" + o, rows, rng, base, skip, take, want));
            base += rows;
        }
        return slices;
    }

    @Test
    void scansAfterTheFirstReadTheSameRowsFromMemoryWithBytesReadCountedOnce() throws Exception {
        List<String> want = new ArrayList<>();
        List<String[]> slices = objects(20261127L, 24, want);
        long total = 0;
        for (String[] s : slices) {
            total += Long.parseLong(s[4]);
        }
        // Both decoders, each after the other, with and without fetching ahead.
        String[][] passes = {{"txlog", "8"}, {"txlog", "0"}, {"parquet", "8"}, {"parquet", "0"},
                             {"txlog", "8"}};
        for (int p = 0; p < passes.length; p++) {
            Configuration c = base(passes[p][0]);
            c.setInt(SliceReader.PREFETCH_OBJECTS, Integer.parseInt(passes[p][1]));
            int opensBefore = Remote.OPENS.get();
            long readBefore = bytesReadOnThisThread();
            try (SliceReader r = reader(slices, p % 2 == 0 ? 4096 : 97, c)) {
                assertEquals(want, rows(r), "pass " + p);
            }
            int opens = Remote.OPENS.get() - opensBefore;
            long read = bytesReadOnThisThread() - readBefore;
            System.out.println("pass " + p + " " + String.join("/", passes[p]) + ": opens "
                               + opens + ", bytes read " + read + " of " + total);
            assertEquals(p == 0 ? slices.size() : 0, opens, "pass " + p);
            if (p > 0 || !"0".equals(passes[p][1])) {
                assertEquals(total, read, "bytes read, pass " + p);
            }
            assertEquals(slices.size(), keptAndIntact(slices, c), "pass " + p);
        }
    }

    @Test
    void aKeptObjectIsNotReadAgainAfterTheIdleTimeWhoeverLookedAtIt() {
        AtomicLong now = new AtomicLong(1_000_000_000L);
        RecentObjects recent = new RecentObjects(now::get);
        Configuration c = new Configuration(false);
        c.setLong(RecentObjects.BYTES, 1 << 20);
        c.setLong(RecentObjects.IDLE_MS, 5_000);
        Object client = new Object();
        byte[] a = {1};
        byte[] b = {2};
        recent.put(client, "s3a://b/a.crc32-00000000.parquet", a, 1, c);
        now.addAndGet(TimeUnit.SECONDS.toNanos(1));
        recent.put(client, "s3a://b/b.crc32-00000000.parquet", b, 1, c);
        now.addAndGet(TimeUnit.MILLISECONDS.toNanos(3_500));
        // What a task does on an object another task fetched ahead of it: not a read.
        recent.holds(client, "s3a://b/a.crc32-00000000.parquet", new byte[] {1});
        now.addAndGet(TimeUnit.MILLISECONDS.toNanos(1_000));  // a: 5.5 s unused, b: 4.5 s
        assertNull(recent.get(client, "s3a://b/a.crc32-00000000.parquet", 1, c),
                   "an object unused for longer than the idle time is still served");
    }

    @Test
    void entriesTheCollectorClearedDoNotPushOutLiveOnes() throws Exception {
        AtomicLong now = new AtomicLong(1_000_000_000L);
        RecentObjects recent = new RecentObjects(now::get);
        Configuration c = new Configuration(false);
        c.setLong(RecentObjects.BYTES, 12);
        c.setLong(RecentObjects.IDLE_MS, 60_000);
        Object client = new Object();
        String[] keys = new String[4];
        for (int i = 0; i < 4; i++) {
            keys[i] = "s3a://b/" + i + ".crc32-00000000.parquet";
        }
        for (int i = 0; i < 3; i++) {
            recent.put(client, keys[i], new byte[4], 4, c);
            now.addAndGet(1);
        }
        // The collector clears the middle one (as it may any softly held array).
        java.lang.reflect.Field entries = RecentObjects.class.getDeclaredField("entries");
        entries.setAccessible(true);
        int i = 0;
        for (Object e : ((java.util.Map<?, ?>) entries.get(recent)).values()) {
            if (i++ == 1) {
                ((java.lang.ref.SoftReference<?>) e).clear();  // (the entry holds them)
            }
        }
        recent.put(client, keys[3], new byte[4], 4, c);  // 8 live bytes + 4 <= 12
        assertNotNull(recent.get(client, keys[0], 4, c),
                      "a live entry dropped for room a cleared one held");
    }

    @Test
    void objectsReadFromLocalDiskAreNotKept() throws Exception {
        List<String> want = new ArrayList<>();
        List<String[]> slices = objects(7L, 4, want);
        for (String[] s : slices) {
            s[0] = dir.resolve(s[0].substring("rmt://bkt/".length())).toUri().toString();
        }
        for (String decoder : new String[] {"txlog", "parquet"}) {
            try (SliceReader r = reader(slices, 4096, base(decoder))) {
                assertEquals(want, rows(r), decoder);
            }
            assertEquals(0, RecentObjects.SHARED.size(), decoder);
        }
    }

    @Test
    void heldIsTheSumOfTheEntriesAndWithinTheBoundWhateverTheOperations() throws Exception {
        long seed = 99L;
        System.out.println("recent objects accounting, seed " + seed);
        Random rng = new Random(seed);
        AtomicLong now = new AtomicLong(1_000_000_000L);
        RecentObjects recent = new RecentObjects(now::get);
        java.lang.reflect.Field entries = RecentObjects.class.getDeclaredField("entries");
        entries.setAccessible(true);
        Object[] clients = {new Object(), new Object()};
        for (int op = 0; op < 20_000; op++) {
            Configuration c = new Configuration(false);
            long cap = 1 + rng.nextInt(64);
            c.setLong(RecentObjects.BYTES, cap);
            c.setLong(RecentObjects.IDLE_MS, 1 + rng.nextInt(20));
            Object client = clients[rng.nextInt(2)];
            String key = "s3a://b/" + rng.nextInt(12) + ".crc32-00000000.parquet";
            int length = 1 + rng.nextInt(16);
            int what = rng.nextInt(4);
            switch (what) {
                case 0, 1 -> recent.put(client, key, new byte[length], length, c);
                case 2 -> recent.get(client, key, length, c);
                default -> recent.holds(client, key, new byte[length]);
            }
            now.addAndGet(TimeUnit.MILLISECONDS.toNanos(rng.nextInt(3)));
            long sum = 0;
            synchronized (recent) {
                for (Object e : ((java.util.Map<?, ?>) entries.get(recent)).values()) {
                    java.lang.reflect.Field l = e.getClass().getDeclaredField("length");
                    l.setAccessible(true);
                    sum += l.getInt(e);
                }
            }
            assertEquals(sum, recent.heldBytes(), "op " + op);
            assertTrue(what == 3 || sum <= cap, "op " + op + ": " + sum + " > " + cap);
        }
    }

    @Test
    void theBoundTakesASizeAsSparkSettingsAreWritten() {
        Configuration c = new Configuration(false);
        c.set(RecentObjects.BYTES, "1g");
        assertEquals(1L << 30, RecentObjects.capacity(c));
    }

    @Test
    void aMalformedBoundIsNamedNotTakenForADamagedObject() throws Exception {
        List<String> want = new ArrayList<>();
        List<String[]> slices = objects(5L, 2, want);
        Configuration c = base("txlog");
        c.set(RecentObjects.BYTES, "lots");
        String message = "";
        try (SliceReader r = reader(slices, 4096, c)) {
            rows(r);
        } catch (IOException | RuntimeException e) {
            message = String.valueOf(e.getMessage());
        }
        System.out.println("with txlog.scan.cache.bytes=lots: " + message);
        assertTrue(message.contains(RecentObjects.BYTES), message);
    }
}

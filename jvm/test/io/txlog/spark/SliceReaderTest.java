package io.txlog.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.example.data.Group;
import org.apache.parquet.example.data.simple.SimpleGroupFactory;
import org.apache.parquet.hadoop.ParquetWriter;
import org.apache.parquet.hadoop.example.ExampleParquetWriter;
import org.apache.parquet.hadoop.metadata.CompressionCodecName;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.MessageTypeParser;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class SliceReaderTest {
    private static final MessageType SCHEMA = MessageTypeParser.parseMessageType(
        "message m { optional binary value; }");

    @TempDir
    java.nio.file.Path dir;

    /** Writes {@code rows} values "name-i" as one object; returns its path. */
    private String write(String name, int rows) throws IOException {
        return write(name, rows, CompressionCodecName.UNCOMPRESSED);
    }

    private String write(String name, int rows, CompressionCodecName codec) throws IOException {
        Path path = new Path(dir.resolve(name + ".parquet").toUri());
        SimpleGroupFactory groups = new SimpleGroupFactory(SCHEMA);
        try (ParquetWriter<Group> w = ExampleParquetWriter.builder(path)
                 .withConf(new Configuration()).withType(SCHEMA).withCompressionCodec(codec)
                 .build()) {
            for (int i = 0; i < rows; i++) {
                w.write(groups.newGroup().append("value", name + "-" + i));
            }
        }
        return path.toString();
    }

    /** A plan line: group 0, the whole object at base offset {@code base}. */
    private String[] slice(String path, long base, long skip, long take) throws IOException {
        long bytes = Files.size(java.nio.file.Paths.get(new Path(path).toUri()));
        return new String[] {"0", path, "t", "0", Long.toString(base), Long.toString(skip),
                             Long.toString(take), "0", Long.toString(bytes),
                             Long.toString(bytes)};
    }

    private static SliceReader reader(List<String[]> slices, int batchSize) {
        return reader(slices, batchSize, new Configuration());
    }

    /** Objects read by Spark's Parquet reader (the tests of how it is set up and reused). */
    private static Configuration parquetDecoder() {
        Configuration conf = new Configuration();
        conf.set(DirectObject.DECODER, "parquet");
        return conf;
    }

    private static SliceReader reader(List<String[]> slices, int batchSize, Configuration base) {
        StructType schema = new StructType()
            .add("value", DataTypes.BinaryType).add("offset", DataTypes.LongType);
        List<OutputColumn> columns = OutputColumn.plan(schema, false);
        Configuration conf = PlannedScanProvider.readerConf(base, columns);
        SlicePartition part = SlicePartition.ofSize(slices.size());
        for (int i = 0; i < slices.size(); i++) {
            String[] f = slices.get(i);
            part.paths[i] = f[1];
            part.topics[i] = f[2];
            part.partitions[i] = Integer.parseInt(f[3]);
            part.bases[i] = Long.parseLong(f[4]);
            part.skips[i] = Long.parseLong(f[5]);
            part.takes[i] = Long.parseLong(f[6]);
            part.appendMs[i] = Long.parseLong(f[7]);
            part.objectBytes[i] = Long.parseLong(f[9]);
            part.addBytes(Long.parseLong(f[8]));
        }
        return new SliceReader(part, columns, batchSize, true, conf);
    }

    @Test
    void vectorsStayWithinTheBatchSizeForAnObjectOfManyMoreRows() throws Exception {
        int rows = 20_000;
        int batchSize = 64;
        List<String[]> slices = new ArrayList<>();
        slices.add(slice(write("big", rows), 0, 0, rows));
        int seen = 0;
        try (SliceReader r = reader(slices, batchSize, parquetDecoder())) {
            while (r.next()) {
                ColumnarBatch b = r.get();
                assertTrue(b.numRows() <= batchSize, "batch of " + b.numRows());
                assertTrue(r.vectorCapacity() <= batchSize, "capacity " + r.vectorCapacity());
                for (int i = 0; i < b.numRows(); i++, seen++) {
                    assertEquals("big-" + seen,
                                 new String(b.column(0).getBinary(i), StandardCharsets.UTF_8));
                    assertEquals(seen, b.column(1).getLong(i));
                }
            }
            assertEquals(1, r.readersOpened());
        }
        assertEquals(rows, seen);
    }

    @Test
    void oneReaderCarriesOnThroughObjectsAndSlicesInsideThem() throws Exception {
        // {rows in the object, first row read, rows read, base offset}: objects read whole
        // and in part, so the next object is handed to a reader that has decoded all of
        // its object, or opened anew where it has not.
        long[][] plan = {{5, 0, 5, 0}, {300, 10, 190, 100}, {7, 0, 7, 1000},
                         {300, 0, 300, 2000}, {3, 1, 1, 3000}, {4, 0, 4, 4000}};
        List<String[]> slices = new ArrayList<>();
        List<String> want = new ArrayList<>();
        List<Long> wantOffsets = new ArrayList<>();
        for (int o = 0; o < plan.length; o++) {
            long[] p = plan[o];
            slices.add(slice(write("o" + o, (int) p[0]), p[3], p[1], p[2]));
            for (long i = p[1]; i < p[1] + p[2]; i++) {
                want.add("o" + o + "-" + i);
                wantOffsets.add(p[3] + i);
            }
        }
        List<String> values = new ArrayList<>();
        List<Long> offsets = new ArrayList<>();
        try (SliceReader r = reader(slices, 128, parquetDecoder())) {
            while (r.next()) {
                ColumnarBatch b = r.get();
                assertTrue(r.vectorCapacity() <= 128);
                for (int i = 0; i < b.numRows(); i++) {
                    values.add(new String(b.column(0).getBinary(i), StandardCharsets.UTF_8));
                    offsets.add(b.column(1).getLong(i));
                }
            }
            assertFalse(r.next());
            // Fresh for the first object and after the one read in part, else carried on.
            assertEquals(2, r.readersOpened());
        }
        assertEquals(want, values);
        assertEquals(wantOffsets, offsets);
    }

    @Test
    void compressedObjectsHandedOnShareOneDecompressor() throws Exception {
        // Each reader released its decompressors at the end of its object: the next object's
        // reader set them up again (a buffer and a codec stream per object).
        List<String[]> slices = new ArrayList<>();
        List<String> want = new ArrayList<>();
        for (int o = 0; o < 6; o++) {
            slices.add(slice(write("z" + o, 50 + o, CompressionCodecName.SNAPPY), 100L * o, 0,
                             50 + o));
            for (int i = 0; i < 50 + o; i++) {
                want.add("z" + o + "-" + i);
            }
        }
        List<String> values = new ArrayList<>();
        try (SliceReader r = reader(slices, 64, parquetDecoder())) {
            while (r.next()) {
                ColumnarBatch b = r.get();
                for (int i = 0; i < b.numRows(); i++) {
                    values.add(new String(b.column(0).getBinary(i), StandardCharsets.UTF_8));
                }
            }
            assertEquals(1, r.readersOpened());
            assertEquals(1, r.decompressorsSetUp(), "one decompressor for objects 2..6");
        }
        assertEquals(want, values);
    }

    /** Prefetch on (on local disk too), at most {@code objects} objects ahead. */
    private static Configuration prefetching(int objects, long bytes) {
        Configuration conf = new Configuration();
        conf.setBoolean(SliceReader.PREFETCH_LOCAL, true);
        conf.setInt(SliceReader.PREFETCH_OBJECTS, objects);
        conf.setLong(SliceReader.PREFETCH_BYTES, bytes);
        return conf;
    }

    private static long prefetchThreads() {
        return Thread.getAllStackTraces().keySet().stream()
            .filter(t -> t.isAlive() && t.getName().startsWith(ObjectPrefetch.THREAD_PREFIX))
            .count();
    }

    /** Objects of random sizes, read in full or in part; returns the values and offsets
     * the reader must return, in order. */
    private List<String[]> manyObjects(int n, long seed, List<String> want, List<Long> wantOffsets)
        throws IOException {
        Random rng = new Random(seed);
        List<String[]> slices = new ArrayList<>();
        long base = 0;
        for (int o = 0; o < n; o++) {
            int rows = 1 + rng.nextInt(400);
            int skip = rng.nextInt(4) == 0 ? rng.nextInt(rows) : 0;
            int take = rows - skip - (rng.nextInt(4) == 0 ? rng.nextInt(rows - skip) : 0);
            slices.add(slice(write("s" + seed + "m" + o, rows), base, skip, take));
            for (long i = skip; i < skip + take; i++) {
                want.add("s" + seed + "m" + o + "-" + i);
                wantOffsets.add(base + i);
            }
            base += rows;
        }
        return slices;
    }

    @Test
    void prefetchReturnsEveryRowInOrderAndLeavesNoThread() throws Exception {
        for (long[] window : new long[][] {{4, 32L << 20}, {8, 1}, {1, 32L << 20}}) {
            long seed = 32 + window[0];
            System.out.println("prefetch window " + window[0] + " objects / " + window[1]
                               + " bytes, seed " + seed);
            List<String> want = new ArrayList<>();
            List<Long> wantOffsets = new ArrayList<>();
            List<String[]> slices = manyObjects(60, seed, want, wantOffsets);
            List<String> values = new ArrayList<>();
            List<Long> offsets = new ArrayList<>();
            long threadsWhileReading = 0;
            SliceReader r = reader(slices, 100, prefetching((int) window[0], window[1]));
            try {
                while (r.next()) {
                    ColumnarBatch b = r.get();
                    threadsWhileReading = Math.max(threadsWhileReading, prefetchThreads());
                    for (int i = 0; i < b.numRows(); i++) {
                        values.add(new String(b.column(0).getBinary(i), StandardCharsets.UTF_8));
                        offsets.add(b.column(1).getLong(i));
                    }
                }
            } finally {
                r.close();
            }
            assertTrue(threadsWhileReading > 0, "objects were fetched ahead");
            assertEquals(0, prefetchThreads(), "no prefetch thread outlives close()");
            assertEquals(want, values);
            assertEquals(wantOffsets, offsets);
        }
    }

    @Test
    void aMissingObjectFailsWhereItIsReadAfterTheRowsBeforeIt() throws Exception {
        List<String> want = new ArrayList<>();
        List<Long> wantOffsets = new ArrayList<>();
        List<String[]> slices = manyObjects(20, 7, want, wantOffsets);
        String gone = slices.get(12)[1];
        Files.delete(java.nio.file.Paths.get(new Path(gone).toUri()));
        List<String> values = new ArrayList<>();
        SliceReader r = reader(slices, 100, prefetching(8, 32L << 20));
        IOException e;
        try {
            e = assertThrows(IOException.class, () -> {
                while (r.next()) {
                    ColumnarBatch b = r.get();
                    for (int i = 0; i < b.numRows(); i++) {
                        values.add(new String(b.column(0).getBinary(i), StandardCharsets.UTF_8));
                    }
                }
            });
        } finally {
            r.close();
        }
        assertTrue(e.getMessage().contains(gone) && e.getMessage().contains("is gone"),
                   e.getMessage());
        int before = 0;
        while (before < want.size() && !want.get(before).startsWith("s7m12-")) {
            before++;
        }
        assertEquals(want.subList(0, before), values, "every row of the objects before it");
        assertEquals(0, prefetchThreads());
    }

    @Test
    void closingPartWayLeavesNoPrefetchThread() throws Exception {
        List<String[]> slices = manyObjects(40, 11, new ArrayList<>(), new ArrayList<>());
        SliceReader r = reader(slices, 50, prefetching(8, 32L << 20));
        assertTrue(r.next());
        assertTrue(r.next());
        assertTrue(prefetchThreads() > 0);
        r.close();
        assertEquals(0, prefetchThreads());
    }
}

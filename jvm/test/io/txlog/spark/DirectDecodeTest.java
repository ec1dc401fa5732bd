package io.txlog.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.IOException;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.column.ParquetProperties.WriterVersion;
import org.apache.parquet.example.data.Group;
import org.apache.parquet.example.data.simple.SimpleGroupFactory;
import org.apache.parquet.hadoop.ParquetWriter;
import org.apache.parquet.hadoop.example.ExampleParquetWriter;
import org.apache.parquet.hadoop.metadata.CompressionCodecName;
import org.apache.parquet.io.api.Binary;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.MessageTypeParser;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** txlog's own decoder of batch objects read whole, against what the objects hold and
 * against Spark's Parquet reader, on objects of many shapes, damaged ones included. */
class DirectDecodeTest {
    private static final MessageType KAFKA = MessageTypeParser.parseMessageType(
        "message spark_schema { optional binary key; optional binary value;"
            + " optional group headers (LIST) { repeated group list {"
            + " optional group element { required binary key (STRING); optional binary value; }"
            + " } } optional int64 timestamp (TIMESTAMP(MILLIS,true)); }");
    /** The same with a string key, as a writer of string keys writes them. */
    private static final MessageType KAFKA_STRING_KEY = MessageTypeParser.parseMessageType(
        "message spark_schema { optional binary key (STRING); optional binary value;"
            + " optional group headers (LIST) { repeated group list {"
            + " optional group element { required binary key (STRING); optional binary value; }"
            + " } } optional int64 timestamp (TIMESTAMP(MILLIS,true)); }");
    private static final StructType HEADER = new StructType()
        .add("key", DataTypes.StringType, false).add("value", DataTypes.BinaryType);
    private static final StructType READ = new StructType()
        .add("key", DataTypes.BinaryType).add("value", DataTypes.BinaryType)
        .add("headers", DataTypes.createArrayType(HEADER))
        .add("timestamp", DataTypes.TimestampType).add("timestampType", DataTypes.IntegerType)
        .add("offset", DataTypes.LongType);
    private static final long APPEND_MS = 1_700_000_000_000L;

    @TempDir
    java.nio.file.Path dir;

    /** How an object is written. */
    private static final class Shape {
        boolean dictionary;
        CompressionCodecName codec = CompressionCodecName.SNAPPY;
        WriterVersion version = WriterVersion.PARQUET_1_0;
        int pageSize = 1 << 20;
        long rowGroupSize = 128L << 20;
        double nullKeys;
        double nullValues;
        double nullTimestamps;
        double withHeaders;
        int headersFrom;  // rows before this one have no headers
        int distinctKeys = 50;
        MessageType schema = KAFKA;
    }

    /** Writes {@code rows} random records; adds the rows the object must read as to want
     * (rows [skip, skip + take), at base offset {@code base}). */
    private String[] object(String name, int rows, Shape s, Random rng, long base, int skip,
                            int take, List<String> want) throws IOException {
        Path path = new Path(dir.resolve(name + ".parquet").toUri());
        SimpleGroupFactory groups = new SimpleGroupFactory(s.schema);
        try (ParquetWriter<Group> w = ExampleParquetWriter.builder(path)
                 .withConf(new Configuration()).withType(s.schema).withCompressionCodec(s.codec)
                 .withDictionaryEncoding(s.dictionary).withWriterVersion(s.version)
                 .withPageSize(s.pageSize).withRowGroupSize(s.rowGroupSize)
                 .withPageRowCountLimit(Math.max(1, s.pageSize / 16)).build()) {
            for (int i = 0; i < rows; i++) {
                Group g = groups.newGroup();
                String key = rng.nextDouble() < s.nullKeys ? null
                    : "k" + rng.nextInt(s.distinctKeys);
                byte[] value = null;
                if (rng.nextDouble() >= s.nullValues) {
                    value = new byte[rng.nextInt(120)];
                    rng.nextBytes(value);
                }
                Long ts = rng.nextDouble() < s.nullTimestamps ? null
                    : APPEND_MS - rng.nextInt(1_000_000);
                String headers = "null";
                if (key != null) {
                    g.append("key", key);
                }
                if (value != null) {
                    g.append("value", Binary.fromConstantByteArray(value));
                }
                if (rng.nextDouble() < s.withHeaders && i >= s.headersFrom) {
                    Group list = g.addGroup("headers");
                    StringBuilder hs = new StringBuilder("[");
                    for (int h = rng.nextInt(3); h > 0; h--) {
                        list.addGroup("list").addGroup("element").append("key", "h" + h)
                            .append("value", "v" + h);
                        hs.append("h").append(h).append("=").append(hex(("v" + h).getBytes()))
                            .append(",");
                    }
                    headers = hs.append("]").toString();
                }
                if (ts != null) {
                    g.append("timestamp", ts);
                }
                w.write(g);
                if (i >= skip && i < skip + take) {
                    long micros = (ts != null ? ts : APPEND_MS) * 1000L;
                    want.add(String.join("|", key == null ? "null" : hex(key.getBytes()),
                                         value == null ? "null" : hex(value), headers,
                                         Long.toString(micros), ts != null ? "0" : "1",
                                         Long.toString(base + i)));
                }
            }
        }
        long bytes = Files.size(java.nio.file.Paths.get(path.toUri()));
        return new String[] {path.toString(), Long.toString(base), Integer.toString(skip),
                             Integer.toString(take), Long.toString(bytes)};
    }

    private static String hex(byte[] b) {
        StringBuilder s = new StringBuilder();
        for (byte x : b) {
            s.append(String.format("%02x", x));
        }
        return s.toString();
    }

    private static SliceReader reader(List<String[]> slices, int batchSize, String decoder) {
        Configuration base = new Configuration();
        base.set(DirectObject.DECODER, decoder);
        return TestSlices.reader(slices, batchSize, base, READ, APPEND_MS);
    }

    /** Every row the reader returns, as key|value|headers|timestamp|timestampType|offset. */
    private static List<String> rows(SliceReader r, int batchSize) throws IOException {
        List<String> out = new ArrayList<>();
        while (r.next()) {
            ColumnarBatch b = r.get();
            assertTrue(b.numRows() <= batchSize, "a batch of " + b.numRows() + " rows");
            for (int i = 0; i < b.numRows(); i++) {
                String headers = "null";
                if (!b.column(2).isNullAt(i)) {
                    ColumnarArray a = b.column(2).getArray(i);
                    StringBuilder hs = new StringBuilder("[");
                    for (int j = 0; j < a.numElements(); j++) {
                        InternalRow h = a.getStruct(j, 2);
                        hs.append(h.getUTF8String(0)).append("=").append(hex(h.getBinary(1)))
                            .append(",");
                    }
                    headers = hs.append("]").toString();
                }
                out.add(String.join("|",
                    b.column(0).isNullAt(i) ? "null" : hex(b.column(0).getBinary(i)),
                    b.column(1).isNullAt(i) ? "null" : hex(b.column(1).getBinary(i)), headers,
                    Long.toString(b.column(3).getLong(i)), Integer.toString(b.column(4).getInt(i)),
                    Long.toString(b.column(5).getLong(i))));
            }
        }
        return out;
    }

    private static Shape randomShape(Random rng) {
        Shape s = new Shape();
        s.dictionary = rng.nextBoolean();
        s.codec = rng.nextBoolean() ? CompressionCodecName.SNAPPY
            : CompressionCodecName.UNCOMPRESSED;
        s.version = rng.nextInt(4) == 0 ? WriterVersion.PARQUET_2_0 : WriterVersion.PARQUET_1_0;
        s.pageSize = rng.nextBoolean() ? 1 << 20 : 512 + rng.nextInt(4096);
        s.rowGroupSize = rng.nextBoolean() ? 128L << 20 : 8192 + rng.nextInt(65536);
        s.nullKeys = rng.nextInt(3) == 0 ? 0 : rng.nextDouble();
        s.nullValues = rng.nextInt(3) == 0 ? 0 : rng.nextDouble() * 0.3;
        s.nullTimestamps = rng.nextInt(3) == 0 ? 0 : rng.nextDouble();
        s.withHeaders = rng.nextInt(4) == 0 ? rng.nextDouble() : 0;
        s.distinctKeys = rng.nextBoolean() ? 5 : 100_000;
        s.schema = rng.nextInt(4) == 0 ? KAFKA_STRING_KEY : KAFKA;
        return s;
    }

    @Test
    void randomObjectsReadAsTheyWereWrittenByBothDecoders() throws Exception {
        long seed = 20261127L;
        System.out.println("direct decode equivalence, seed " + seed);
        Random rng = new Random(seed);
        List<String[]> slices = new ArrayList<>();
        List<String> want = new ArrayList<>();
        long base = 0;
        for (int o = 0; o < 40; o++) {
            int rows = 1 + rng.nextInt(rng.nextBoolean() ? 300 : 5000);
            int skip = rng.nextInt(3) == 0 ? rng.nextInt(rows) : 0;
            int take = rows - skip - (rng.nextInt(3) == 0 ? rng.nextInt(rows - skip) : 0);
            slices.add(object("r" + o, rows, randomShape(rng), rng, base, skip, take, want));
            base += rows;
        }
        for (int batchSize : new int[] {4096, 97}) {
            try (SliceReader direct = reader(slices, batchSize, "txlog")) {
                assertEquals(want, rows(direct, batchSize), "txlog's decoder, batch " + batchSize);
                assertTrue(direct.objectsDecodedDirectly() > 20, "most objects decoded directly: "
                           + direct.objectsDecodedDirectly());
                assertTrue(direct.objectsDecodedByParquet() > 0, "some fell back");
                assertEquals(slices.size(),
                             direct.objectsDecodedDirectly() + direct.objectsDecodedByParquet());
            }
            try (SliceReader parquet = reader(slices, batchSize, "parquet")) {
                assertEquals(want, rows(parquet, batchSize), "Spark's Parquet reader");
                assertEquals(0, parquet.objectsDecodedDirectly());
            }
        }
    }

    @Test
    void anObjectIsDecodedARowGroupAtATime() throws Exception {
        Shape s = new Shape();
        s.rowGroupSize = 64 << 10;
        s.pageSize = 8 << 10;
        List<String> want = new ArrayList<>();
        String[] f = object("groups", 20_000, s, new Random(11), 0, 0, 20_000, want);
        byte[] data = Files.readAllBytes(java.nio.file.Paths.get(new Path(f[0]).toUri()));
        ObjectFooter footer = ObjectFooter.read(data, data.length);
        long largestGroup = 0;
        for (ObjectFooter.RowGroup g : footer.rowGroups) {
            long stored = 0;
            for (ObjectFooter.Chunk c : g.chunks) {
                stored += c.compressed;
            }
            largestGroup = Math.max(largestGroup, stored);
        }
        assertTrue(footer.rowGroups.size() >= 4, footer.rowGroups.size() + " row groups");
        StructType stored = OutputColumn.storedSchema(OutputColumn.plan(READ, true));
        DirectObject o = DirectObject.decode(data, stored);
        assertEquals(footer.rowGroups.size(), o.groupCount());
        long rows = 0;
        for (int g = 0; g < o.groupCount(); g++) {
            assertEquals(o.groupRows(g), o.group(g).numRows());
            rows += o.groupRows(g);
            // About one row group's pages at a time (values of random bytes hardly compress).
            assertTrue(o.decodedBytesHeld() <= 2 * largestGroup, "row group " + g + ": "
                       + o.decodedBytesHeld() + " decoded bytes held, the largest row group "
                       + "stores " + largestGroup);
        }
        assertEquals(20_000, rows);
        try (SliceReader r = reader(java.util.Collections.singletonList(f), 4096, "txlog")) {
            assertEquals(want, rows(r, 4096));
            assertEquals(1, r.objectsDecodedDirectly());
        }
    }

    @Test
    void headersInALaterRowGroupGiveTheWholeObjectToParquet() throws Exception {
        Shape s = new Shape();
        s.rowGroupSize = 64 << 10;
        s.pageSize = 8 << 10;
        s.withHeaders = 1;
        s.headersFrom = 15_000;
        List<String> want = new ArrayList<>();
        String[] f = object("late", 16_000, s, new Random(12), 0, 0, 16_000, want);
        try (SliceReader r = reader(java.util.Collections.singletonList(f), 4096, "txlog")) {
            assertEquals(want, rows(r, 4096));
            assertEquals(0, r.objectsDecodedDirectly());
            assertEquals(1, r.objectsDecodedByParquet());
        }
    }

    @Test
    void kafkaShapedObjectsAreDecodedDirectlyAndOthersByParquet() throws Exception {
        Random rng = new Random(5);
        List<String> want = new ArrayList<>();
        List<String[]> slices = new ArrayList<>();
        for (int o = 0; o < 4; o++) {
            Shape s = new Shape();
            s.dictionary = o % 2 == 0;
            s.codec = o < 2 ? CompressionCodecName.SNAPPY : CompressionCodecName.UNCOMPRESSED;
            s.nullKeys = 0.3;
            slices.add(object("k" + o, 500, s, rng, 1000L * o, 0, 500, want));
        }
        try (SliceReader r = reader(slices, 4096, "txlog")) {
            assertEquals(want, rows(r, 4096));
            assertEquals(4, r.objectsDecodedDirectly());
            assertEquals(0, r.objectsDecodedByParquet());
        }
        // Records with headers: that object alone is read by Spark's reader.
        Shape h = new Shape();
        h.withHeaders = 1;
        slices.add(object("h", 50, h, rng, 9000, 0, 50, want));
        try (SliceReader r = reader(slices, 4096, "txlog")) {
            assertEquals(want, rows(r, 4096));
            assertEquals(4, r.objectsDecodedDirectly());
            assertEquals(1, r.objectsDecodedByParquet());
        }
    }

    @Test
    void aTypedTopicsObjectsAreReadByParquet() throws Exception {
        MessageType typed = MessageTypeParser.parseMessageType(
            "message m { optional binary value; optional int32 n; }");
        Path path = new Path(dir.resolve("typed.parquet").toUri());
        SimpleGroupFactory groups = new SimpleGroupFactory(typed);
        try (ParquetWriter<Group> w = ExampleParquetWriter.builder(path)
                 .withConf(new Configuration()).withType(typed).build()) {
            for (int i = 0; i < 10; i++) {
                w.write(groups.newGroup().append("value", "v" + i).append("n", i));
            }
        }
        long bytes = Files.size(java.nio.file.Paths.get(path.toUri()));
        // Read for its value alone: the object is not Kafka-shaped, so not decoded directly.
        StructType schema = new StructType().add("value", DataTypes.BinaryType);
        List<OutputColumn> columns = OutputColumn.plan(schema, false);
        SlicePartition part = SlicePartition.ofSize(1);
        part.paths[0] = path.toString();
        part.topics[0] = "t";
        part.takes[0] = 10;
        part.objectBytes[0] = bytes;
        part.addBytes(bytes);
        List<String> values = new ArrayList<>();
        try (SliceReader r = new SliceReader(part, columns, 100, true,
                PlannedScanProvider.readerConf(new Configuration(), columns))) {
            while (r.next()) {
                for (int i = 0; i < r.get().numRows(); i++) {
                    values.add(new String(r.get().column(0).getBinary(i)));
                }
            }
            assertEquals(0, r.objectsDecodedDirectly());
            assertEquals(1, r.objectsDecodedByParquet());
        }
        assertEquals(List.of("v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9"), values);
    }

    /** One uncompressed or snappy object of plain values, and where its value column's
     * first page header keeps its fields. */
    private byte[] plainObject(CompressionCodecName codec) throws IOException {
        Shape s = new Shape();
        s.codec = codec;
        String[] f = object("p" + codec, 300, s, new Random(3), 0, 0, 300, new ArrayList<>());
        return Files.readAllBytes(java.nio.file.Paths.get(new Path(f[0]).toUri()));
    }

    private static StructType kafkaStored() {
        return OutputColumn.storedSchema(OutputColumn.plan(READ, true));
    }

    /** The value chunk's first page header: positions of its uncompressed size, compressed
     * size and encoding varints, with their lengths ({pos, len} x 3). */
    private static int[] valuePageFields(byte[] data) throws Exception {
        ObjectFooter footer = ObjectFooter.read(data, data.length);
        ObjectFooter.Chunk c = null;
        for (ObjectFooter.Chunk x : footer.rowGroups.get(0).chunks) {
            if (x.path.equals("value")) {
                c = x;
            }
        }
        int p = (int) c.dataPage;
        assertEquals(0x15, data[p] & 0xff);  // field 1, i32: the page type
        assertEquals(0x00, data[p + 1]);     // DATA_PAGE
        int[] out = new int[6];
        p += 2;
        for (int k = 0; k < 2; k++) {
            assertEquals(0x15, data[p] & 0xff);  // fields 2 and 3: the sizes
            out[2 * k] = ++p;
            while ((data[p] & 0x80) != 0) {
                p++;
            }
            out[2 * k + 1] = ++p - out[2 * k];
        }
        if ((data[p] & 0xff) == 0x15) {  // field 4, the page's CRC, where it has one
            while ((data[++p] & 0x80) != 0) {
                p = p + 0;
            }
            p++;
        }
        int h = data[p] & 0xff;  // field 5, the data page header (after field 3 or 4)
        assertTrue(h == 0x2c || h == 0x1c, "a data page header: " + h);
        assertEquals(0x15, data[p + 1] & 0xff);  // its num_values
        p += 2;
        while ((data[p] & 0x80) != 0) {
            p++;
        }
        p++;
        assertEquals(0x15, data[p] & 0xff);  // its encoding
        out[4] = p + 1;
        out[5] = 1;
        return out;
    }

    /** The largest varint of {@code len} bytes, written at {@code pos}. */
    private static void maxVarint(byte[] data, int pos, int len) {
        for (int i = 0; i < len; i++) {  // the low bit clear: zigzag makes it positive
            data[pos + i] = (byte) (i == 0 ? (len > 1 ? 0xfe : 0x7e) : i < len - 1 ? 0xff : 0x7f);
        }
    }

    /** Decodes every row group of {@code data} (a damaged page is found as its row group
     * is decoded). */
    private static void decodeAll(byte[] data) throws Exception {
        DirectObject o = DirectObject.decode(data, kafkaStored());
        for (int g = 0; g < o.groupCount(); g++) {
            o.group(g);
        }
    }

    @Test
    void damagedObjectsAreRefusedNeverMisread() throws Exception {
        for (CompressionCodecName codec : new CompressionCodecName[] {
                CompressionCodecName.UNCOMPRESSED, CompressionCodecName.SNAPPY}) {
            byte[] good = plainObject(codec);
            int[] at = valuePageFields(good);
            decodeAll(good);  // decodes as it is

            byte[] footerLength = good.clone();
            footerLength[good.length - 5] = 0x7f;  // the footer's length: beyond the object
            assertThrows(CompactReader.Damaged.class,
                         () -> decodeAll(footerLength));

            byte[] uncompressed = good.clone();
            maxVarint(uncompressed, at[0], at[1]);
            assertThrows(CompactReader.Damaged.class,
                         () -> decodeAll(uncompressed));

            byte[] compressed = good.clone();
            maxVarint(compressed, at[2], at[3]);
            assertThrows(CompactReader.Damaged.class,
                         () -> decodeAll(compressed));

            byte[] encoding = good.clone();
            encoding[at[4]] = 0x0e;  // DELTA_BYTE_ARRAY (7)
            assertThrows(PageDecoder.Unsupported.class,
                         () -> decodeAll(encoding));
        }
    }

    @Test
    void aDamagedObjectFailsTheScanWithTheBatchObjectError() throws Exception {
        byte[] bad = plainObject(CompressionCodecName.SNAPPY);
        int[] at = valuePageFields(bad);
        maxVarint(bad, at[0], at[1]);
        java.nio.file.Path file = dir.resolve("bad.parquet");
        Files.write(file, bad);
        List<String[]> slices = new ArrayList<>();
        slices.add(new String[] {new Path(file.toUri()).toString(), "0", "0", "300",
                                 Long.toString(bad.length)});
        try (SliceReader r = reader(slices, 100, "txlog")) {
            IOException e = assertThrows(IOException.class, () -> rows(r, 100));
            assertTrue(e.getMessage().contains("cannot read batch object")
                       && e.getMessage().contains("txlog check"), e.getMessage());
        }
    }

    @Test
    void randomlyDamagedBytesAreRefusedOrDecodedNeverAnotherError() throws Exception {
        long seed = 77;
        System.out.println("direct decode damage, seed " + seed);
        Random rng = new Random(seed);
        List<byte[]> objects = new ArrayList<>();
        for (int o = 0; o < 6; o++) {
            Shape s = randomShape(rng);
            s.withHeaders = o == 0 ? 0.5 : 0;
            String[] f = object("d" + o, 200 + rng.nextInt(800), s, rng, 0, 0, 0,
                                new ArrayList<>());
            objects.add(Files.readAllBytes(java.nio.file.Paths.get(new Path(f[0]).toUri())));
        }
        int refused = 0;
        for (int trial = 0; trial < 3000; trial++) {
            byte[] d = objects.get(trial % objects.size()).clone();
            int changes = 1 + rng.nextInt(4);
            for (int c = 0; c < changes; c++) {
                // Mostly in the footer and the page headers' region near the end.
                int pos = rng.nextBoolean() ? d.length - 1 - rng.nextInt(Math.min(d.length, 600))
                    : rng.nextInt(d.length);
                d[pos] = (byte) rng.nextInt(256);
            }
            try {
                DirectObject o = DirectObject.decode(d, kafkaStored());
                for (int g = 0; g < o.groupCount(); g++) {  // every vector readable
                    ColumnarBatch b = o.group(g);
                    for (int i = 0; i < b.numRows(); i++) {
                        if (!b.column(1).isNullAt(i)) {
                            b.column(1).getBinary(i);
                        }
                    }
                }
            } catch (CompactReader.Damaged | PageDecoder.Unsupported e) {
                refused++;
            } catch (Throwable t) {
                fail("trial " + trial + " (seed " + seed + "): " + t, t);
            }
        }
        assertTrue(refused > 100, "damage was seen: " + refused);
    }
}

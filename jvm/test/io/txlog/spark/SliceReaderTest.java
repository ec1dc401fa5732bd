package io.txlog.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.List;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.example.data.Group;
import org.apache.parquet.example.data.simple.SimpleGroupFactory;
import org.apache.parquet.hadoop.ParquetWriter;
import org.apache.parquet.hadoop.example.ExampleParquetWriter;
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
        Path path = new Path(dir.resolve(name + ".parquet").toUri());
        SimpleGroupFactory groups = new SimpleGroupFactory(SCHEMA);
        try (ParquetWriter<Group> w = ExampleParquetWriter.builder(path)
                 .withConf(new Configuration()).withType(SCHEMA).build()) {
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
        StructType schema = new StructType()
            .add("value", DataTypes.BinaryType).add("offset", DataTypes.LongType);
        List<OutputColumn> columns = OutputColumn.plan(schema, false);
        Configuration conf = PlannedScanProvider.readerConf(new Configuration(), columns);
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
        try (SliceReader r = reader(slices, batchSize)) {
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
        try (SliceReader r = reader(slices, 128)) {
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
}

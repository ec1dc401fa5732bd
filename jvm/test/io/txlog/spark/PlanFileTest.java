package io.txlog.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.IntVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.Schema;
import org.junit.jupiter.api.Test;

class PlanFileTest {
    private static final String[] LONGS =
        {"base_offset", "skip", "take", "append_ms", "nbytes", "object_bytes"};

    /** A plan of three slices in groups of 2 and 1, as spark_ext/plan_file.py writes it. */
    private static File write(String header) throws IOException {
        File f = File.createTempFile("txlog-plan-test-", ".arrows");
        List<Field> fields = new java.util.ArrayList<>();
        fields.add(Field.nullable("tp", new ArrowType.Int(32, true)));
        fields.add(Field.nullable("dir", new ArrowType.Int(32, true)));
        fields.add(Field.nullable("name", new ArrowType.Utf8()));
        for (String n : LONGS) {
            fields.add(Field.nullable(n, new ArrowType.Int(64, true)));
        }
        Schema schema = new Schema(fields, Map.of("txlog.plan", header));
        try (BufferAllocator alloc = new RootAllocator();
             VectorSchemaRoot root = VectorSchemaRoot.create(schema, alloc);
             FileOutputStream out = new FileOutputStream(f);
             ArrowStreamWriter w = new ArrowStreamWriter(root, null, out)) {
            root.allocateNew();
            for (int i = 0; i < 3; i++) {
                ((IntVector) root.getVector("tp")).setSafe(i, i == 2 ? 1 : 0);
                ((IntVector) root.getVector("dir")).setSafe(i, i == 2 ? 1 : 0);
                ((VarCharVector) root.getVector("name"))
                    .setSafe(i, ("o" + i + ".parquet").getBytes(StandardCharsets.UTF_8));
                for (int k = 0; k < LONGS.length; k++) {
                    ((BigIntVector) root.getVector(LONGS[k])).setSafe(i, 10L * i + k);
                }
            }
            root.setRowCount(3);
            w.start();
            w.writeBatch();
            w.end();
        }
        return f;
    }

    private static String header(int version, String groups) {
        return "{\"version\": " + version + ", \"dirs\": [\"file:/r/topics/t/0/data/\", "
            + "\"file:/r/topics/t/1/data/\"], \"partitions\": [[\"t\", 0], [\"t\", 1]], "
            + "\"groups\": " + groups + "}";
    }

    @Test
    void aPlanIsReadIntoItsInputPartitionsAndDeleted() throws IOException {
        File f = write(header(PlanFile.VERSION, "[2, 1]"));
        List<SlicePartition> parts = PlanFile.readAndDelete(f.getPath());
        assertFalse(f.exists());
        assertEquals(2, parts.size());
        SlicePartition a = parts.get(0);
        SlicePartition b = parts.get(1);
        assertArrayEquals(new String[] {"file:/r/topics/t/0/data/o0.parquet",
                                        "file:/r/topics/t/0/data/o1.parquet"}, a.paths);
        assertArrayEquals(new String[] {"file:/r/topics/t/1/data/o2.parquet"}, b.paths);
        assertEquals("t", b.topics[0]);
        assertEquals(1, b.partitions[0]);
        assertArrayEquals(new long[] {0, 10}, a.bases);
        assertArrayEquals(new long[] {1, 11}, a.skips);
        assertArrayEquals(new long[] {2, 12}, a.takes);
        assertArrayEquals(new long[] {3, 13}, a.appendMs);
        assertEquals(4 + 14, a.bytes());
        assertArrayEquals(new long[] {25}, b.objectBytes);
        assertArrayEquals(new long[] {22}, b.takes);
    }

    @Test
    void aPlanOfAnotherVersionIsRefusedSayingWhatToDo() throws IOException {
        File f = write(header(PlanFile.VERSION + 1, "[2, 1]"));
        TxlogException e = assertThrows(TxlogException.class,
                                        () -> PlanFile.readAndDelete(f.getPath()));
        assertEquals("txlog.errors.UnsupportedFormatError", e.type());
        assertTrue(e.getMessage().contains("different txlog versions"), e.getMessage());
        assertFalse(f.exists());
    }

    @Test
    void aPlannerAnswerThatFailsToTurnIntoAScanStillRemovesItsPlan() throws IOException {
        File f = write(header(PlanFile.VERSION, "[2, 1]"));
        com.fasterxml.jackson.databind.node.ObjectNode answer =
            new com.fasterxml.jackson.databind.ObjectMapper().createObjectNode();
        answer.put("planFile", f.getPath());
        answer.put("schema", "not a schema");
        answer.put("kafka", true);
        assertThrows(Exception.class, () -> TxlogScan.plannedTable(answer));
        assertFalse(f.exists());
    }

    @Test
    void aPlanWhoseGroupsDoNotAddUpIsRefused() throws IOException {
        for (String groups : new String[] {"[2]", "[2, 2]"}) {
            File f = write(header(PlanFile.VERSION, groups));
            TxlogException e = assertThrows(TxlogException.class,
                                            () -> PlanFile.readAndDelete(f.getPath()));
            assertEquals("txlog.errors.CorruptObjectError", e.type());
        }
    }
}

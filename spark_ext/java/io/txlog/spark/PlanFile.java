package io.txlog.spark;

import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.IntVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;

/**
 * A planned read as the Python planner hands it over (spark_ext/plan_file.py): an Arrow IPC
 * stream in a file on the driver, one row per slice in input-partition order, with a JSON
 * header in the schema's metadata ({@code txlog.plan}: the format version, the folders and
 * the topic-partitions the rows point into, and each input partition's number of rows).
 * The file is deleted once read: a plan is used once.
 */
final class PlanFile {
    /** The plan format this connector reads; the planner writes the same or is refused. */
    static final int VERSION = 1;
    private static final ObjectMapper JSON = new ObjectMapper();

    private PlanFile() {
    }

    /** The plan's input partitions; the file is deleted whether or not it could be read. */
    static List<SlicePartition> readAndDelete(String path) {
        try {
            return read(path);
        } finally {
            new File(path).delete();
        }
    }

    static List<SlicePartition> read(String path) {
        try (FileInputStream in = new FileInputStream(path);
             BufferAllocator alloc = new RootAllocator();
             ArrowStreamReader reader = new ArrowStreamReader(in, alloc)) {
            VectorSchemaRoot root = reader.getVectorSchemaRoot();
            Map<String, String> meta = root.getSchema().getCustomMetadata();
            String text = meta == null ? null : meta.get("txlog.plan");
            if (text == null) {
                throw new TxlogException("txlog.errors.CorruptObjectError",
                    "scan plan " + path + " has no txlog.plan header");
            }
            JsonNode header = JSON.readTree(text);
            int version = header.path("version").asInt(-1);
            if (version != VERSION) {
                throw new TxlogException("txlog.errors.UnsupportedFormatError",
                    "scan plan " + path + " has format " + header.path("version") + " but this "
                        + "txlog JVM connector reads format " + VERSION + ": the jar and the "
                        + "Python package are from different txlog versions; use the jar this "
                        + "txlog ships (`python -m spark_ext.jvm_scan` prints its path)");
            }
            return fill(reader, root, header, path);
        } catch (IOException e) {
            throw new TxlogException("txlog.errors.CorruptObjectError",
                "cannot read scan plan " + path + ": " + e);
        }
    }

    private static List<SlicePartition> fill(ArrowStreamReader reader, VectorSchemaRoot root,
                                             JsonNode header, String path) throws IOException {
        String[] dirs = strings(header.path("dirs"));
        JsonNode tpNodes = header.path("partitions");
        String[] topics = new String[tpNodes.size()];
        int[] numbers = new int[tpNodes.size()];
        for (int i = 0; i < topics.length; i++) {
            topics[i] = tpNodes.get(i).get(0).asText();
            numbers[i] = tpNodes.get(i).get(1).asInt();
        }
        List<SlicePartition> out = new ArrayList<>();
        JsonNode sizes = header.path("groups");
        int group = 0;
        SlicePartition cur = null;
        int at = 0;
        long total = 0;
        while (reader.loadNextBatch()) {
            IntVector tp = (IntVector) root.getVector("tp");
            IntVector dir = (IntVector) root.getVector("dir");
            VarCharVector name = (VarCharVector) root.getVector("name");
            BigIntVector base = (BigIntVector) root.getVector("base_offset");
            BigIntVector skip = (BigIntVector) root.getVector("skip");
            BigIntVector take = (BigIntVector) root.getVector("take");
            BigIntVector appendMs = (BigIntVector) root.getVector("append_ms");
            BigIntVector nbytes = (BigIntVector) root.getVector("nbytes");
            BigIntVector objectBytes = (BigIntVector) root.getVector("object_bytes");
            int rows = root.getRowCount();
            for (int r = 0; r < rows; r++) {
                while (cur == null || at == cur.size()) {
                    if (cur != null) {
                        out.add(cur);
                    }
                    if (group >= sizes.size()) {
                        throw new TxlogException("txlog.errors.CorruptObjectError",
                            "scan plan " + path + " has more rows than its groups hold");
                    }
                    cur = SlicePartition.ofSize(sizes.get(group++).asInt());
                    at = 0;
                }
                int t = tp.get(r);
                cur.paths[at] = dirs[dir.get(r)]
                    + new String(name.get(r), StandardCharsets.UTF_8);
                cur.topics[at] = topics[t];
                cur.partitions[at] = numbers[t];
                cur.bases[at] = base.get(r);
                cur.skips[at] = skip.get(r);
                cur.takes[at] = take.get(r);
                cur.appendMs[at] = appendMs.get(r);
                cur.objectBytes[at] = objectBytes.get(r);
                cur.addBytes(nbytes.get(r));
                at++;
                total++;
            }
        }
        if (cur != null) {
            if (at != cur.size()) {
                throw new TxlogException("txlog.errors.CorruptObjectError",
                    "scan plan " + path + " ends inside an input partition");
            }
            out.add(cur);
        }
        if (group != sizes.size()) {
            throw new TxlogException("txlog.errors.CorruptObjectError",
                "scan plan " + path + " has " + total + " rows, fewer than its groups hold");
        }
        return out;
    }

    private static String[] strings(JsonNode array) {
        String[] out = new String[array.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = array.get(i).asText();
        }
        return out;
    }
}

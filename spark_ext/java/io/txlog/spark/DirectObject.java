package io.txlog.spark;

import java.util.HashMap;
import java.util.List;
import java.util.Map;

import io.txlog.spark.CompactReader.Damaged;
import io.txlog.spark.PageDecoder.Unsupported;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A Kafka-shaped batch object (key, value, headers, timestamp) read whole, decoded by txlog
 * itself instead of parquet-mr and Spark's vectorized reader: its footer, then the stored
 * columns a query reads, row group by row group, into vectors over the decoded pages.
 * Anything else (another schema, codec, encoding or page kind) is {@link Unsupported}, and
 * the caller reads that object the usual way.
 */
final class DirectObject {
    /** Which decoder reads objects read whole: {@code txlog} (this one, where it can) or
     * {@code parquet} (Spark's vectorized Parquet reader, for diagnosis). */
    static final String DECODER = "txlog.scan.decoder";

    /** Objects with more rows than this (or than MAX_RATIO rows per stored byte, beyond
     * 64 Ki rows) are left to Spark's reader: this decoder holds a few arrays of every row
     * of a row group at once (one row group may hold all of the object's rows), and a
     * footer's row count costs nothing to inflate. */
    static final long MAX_ROWS = 1L << 22;
    /** The most bytes an object's pages may decompress into: that of txlog's Python reader
     * (fetch.max.bytes's default, or 64 times the object's size). */
    static final long MIN_BUDGET = 52_428_800L;
    static final long MAX_RATIO = 64;

    private enum Kind { BYTES, MILLIS, HEADERS }

    private final StructType stored;
    private final byte[] data;
    private final List<ObjectFooter.RowGroup> rowGroups;
    private final Map<String, Leaf> leaves;
    private final PageDecoder.Budget budget;
    private final ReadBuffers buffers;  // where pages are decompressed into; null: new arrays
    private final long[] groupRows;
    private long rows;
    // The one row group held decoded (its pages and arrays): the previous one is released
    // when the next is decoded, so that a task holds about a row group, as Spark's reader.
    private int currentGroup = -1;
    private ColumnarBatch current;
    private long currentBytes;  // decompressed bytes of its pages

    private DirectObject(StructType stored, byte[] data, List<ObjectFooter.RowGroup> rowGroups,
                         Map<String, Leaf> leaves, PageDecoder.Budget budget,
                         ReadBuffers buffers) {
        this.stored = stored;
        this.data = data;
        this.rowGroups = rowGroups;
        this.leaves = leaves;
        this.budget = budget;
        this.buffers = buffers;
        this.groupRows = new long[rowGroups.size()];
    }

    /** Whether this decoder can give every stored column of {@code stored} (as Spark reads
     * a Kafka-shaped topic's), so that objects are worth trying with it. */
    static boolean handles(StructType stored) {
        if (stored.size() == 0) {
            return false;
        }
        for (StructField f : stored.fields()) {
            if (kind(f.name(), f.dataType()) == null) {
                return false;
            }
        }
        return true;
    }

    private static Kind kind(String name, DataType t) {
        if ((name.equals("key") || name.equals("value")) && t instanceof BinaryType) {
            return Kind.BYTES;
        }
        if (name.equals("timestamp") && t instanceof TimestampType) {
            return Kind.MILLIS;
        }
        if (name.equals("headers") && t instanceof ArrayType
            && ((ArrayType) t).elementType() instanceof StructType) {
            StructField[] e = ((StructType) ((ArrayType) t).elementType()).fields();
            if (e.length == 2 && e[0].name().equals("key") && e[0].dataType() instanceof StringType
                && e[1].name().equals("value") && e[1].dataType() instanceof BinaryType) {
                return Kind.HEADERS;
            }
        }
        return null;
    }

    /** The object {@code data}, its footer read and every row group's pages checked for
     * what this decoder reads (Unsupported: none of its rows are decoded); its row groups
     * are decoded one at a time, by {@link #group}. */
    static DirectObject decode(byte[] data, StructType stored) throws Damaged, Unsupported {
        return decode(data, data.length, stored, null);
    }

    /** The object in the first {@code length} bytes of {@code data}, its pages decompressed
     * into {@code buffers} (null: arrays of their own). The arrays of {@code buffers} are
     * taken over: what earlier objects decoded into them is no longer read. */
    static DirectObject decode(byte[] data, int length, StructType stored, ReadBuffers buffers)
        throws Damaged, Unsupported {
        if (length < 0 || length > data.length) {
            throw new IllegalArgumentException("an object of " + length + " bytes in an array of "
                                               + data.length);
        }
        if (buffers != null) {
            buffers.releasePages();
        }
        ObjectFooter footer = ObjectFooter.read(data, length);
        if (footer.encrypted) {
            throw new Unsupported("an encrypted object");
        }
        if (footer.rows > Math.min(MAX_ROWS, Math.max(1 << 16, MAX_RATIO * length))) {
            throw new Unsupported(footer.rows + " rows");
        }
        Map<String, Leaf> leaves = kafkaLeaves(footer.schema);
        PageDecoder.Budget budget = new PageDecoder.Budget(
            Math.max(MIN_BUDGET, MAX_RATIO * length));
        DirectObject o = new DirectObject(stored, data, footer.rowGroups, leaves, budget,
                                          buffers);
        for (int g = 0; g < footer.rowGroups.size(); g++) {
            o.check(g);
        }
        return o;
    }

    /** A leaf column of the object: its dotted path, type and level bounds. */
    private static final class Leaf {
        final String path;
        final int type;
        final int maxDef;
        final int maxRep;

        Leaf(String path, int type, int maxDef, int maxRep) {
            this.path = path;
            this.type = type;
            this.maxDef = maxDef;
            this.maxRep = maxRep;
        }
    }

    /** The object's leaf columns by top-level name ({@code headers} by "headers.key" and
     * "headers.value"), where its schema is Kafka-shaped (some of key, value, headers,
     * timestamp, in Kafka's types); else Unsupported. */
    private static Map<String, Leaf> kafkaLeaves(List<ObjectFooter.Element> s)
        throws Damaged, Unsupported {
        if (s.isEmpty() || s.get(0).children < 0 || s.get(0).children > s.size()) {
            throw new Damaged("its footer's schema is malformed");
        }
        Map<String, Leaf> out = new HashMap<>();
        int at = 1;
        for (int c = 0; c < s.get(0).children; c++) {
            if (at >= s.size()) {
                throw new Damaged("its footer's schema is malformed");
            }
            ObjectFooter.Element e = s.get(at);
            if (out.containsKey(e.name) || out.containsKey(e.name + ".key")) {
                throw new Unsupported("a schema naming " + e.name + " twice");
            }
            int def = e.repetition == ObjectFooter.OPTIONAL ? 1 : 0;
            boolean flat = e.children == 0 && e.repetition != ObjectFooter.REPEATED;
            // Bytes, or strings (read as their bytes, as Spark reads them as binary).
            if ((e.name.equals("key") || e.name.equals("value")) && flat
                && e.type == ObjectFooter.BYTE_ARRAY
                && (e.converted < 0 || e.converted == ObjectFooter.UTF8)
                && (e.logical == ObjectFooter.LOGICAL_NONE
                    || e.logical == ObjectFooter.LOGICAL_STRING)) {
                out.put(e.name, new Leaf(e.name, e.type, def, 0));
                at++;
            } else if (e.name.equals("timestamp") && flat && e.type == ObjectFooter.INT64
                       && millisUtc(e)) {
                out.put(e.name, new Leaf(e.name, e.type, def, 0));
                at++;
            } else if (e.name.equals("headers")) {
                at = headers(s, at, out);
            } else {
                throw new Unsupported("not a Kafka-shaped schema (column " + e.name + ")");
            }
        }
        if (at != s.size()) {
            throw new Damaged("its footer's schema is malformed");
        }
        return out;
    }

    private static boolean millisUtc(ObjectFooter.Element e) {
        return e.converted == ObjectFooter.TIMESTAMP_MILLIS
            && (e.logical == ObjectFooter.LOGICAL_NONE
                || e.logical == ObjectFooter.LOGICAL_TS_MILLIS_UTC)
            || e.converted < 0 && e.logical == ObjectFooter.LOGICAL_TS_MILLIS_UTC;
    }

    /** The headers column as Parquet's three-level list of (key, value) structs; returns
     * the index past it. */
    private static int headers(List<ObjectFooter.Element> s, int at, Map<String, Leaf> out)
        throws Unsupported {
        if (at + 4 >= s.size()) {
            throw new Unsupported("headers of another shape");
        }
        ObjectFooter.Element h = s.get(at);
        ObjectFooter.Element list = s.get(at + 1);
        ObjectFooter.Element element = s.get(at + 2);
        ObjectFooter.Element key = s.get(at + 3);
        ObjectFooter.Element value = s.get(at + 4);
        boolean shaped = h.repetition == ObjectFooter.OPTIONAL && h.children == 1 && h.type < 0
            && (h.converted == ObjectFooter.LIST_TYPE || h.logical == ObjectFooter.LOGICAL_LIST)
            && list.repetition == ObjectFooter.REPEATED && list.children == 1 && list.type < 0
            && element.repetition != ObjectFooter.REPEATED && element.children == 2
            && element.type < 0
            && key.name.equals("key") && key.repetition == ObjectFooter.REQUIRED
            && key.type == ObjectFooter.BYTE_ARRAY && key.children == 0
            && value.name.equals("value") && value.repetition == ObjectFooter.OPTIONAL
            && value.type == ObjectFooter.BYTE_ARRAY && value.children == 0;
        if (!shaped) {
            throw new Unsupported("headers of another shape");
        }
        String prefix = h.name + "." + list.name + "." + element.name + ".";
        int def = 2 + (element.repetition == ObjectFooter.OPTIONAL ? 1 : 0);
        out.put("headers.key", new Leaf(prefix + key.name, key.type, def, 1));
        out.put("headers.value", new Leaf(prefix + value.name, value.type, def + 1, 1));
        return at + 5;
    }

    /** The column chunks of row group {@code g} by path. */
    private Map<String, ObjectFooter.Chunk> chunks(int g) throws Unsupported {
        Map<String, ObjectFooter.Chunk> chunks = new HashMap<>();
        for (ObjectFooter.Chunk c : rowGroups.get(g).chunks) {
            if (c.external) {
                throw new Unsupported("a column chunk in another file or encrypted");
            }
            chunks.put(c.path, c);
        }
        return chunks;
    }

    /** Checks row group {@code g}: its headers are null (txlog writes records without
     * headers so), the pages of the other columns read are ones {@link #decodeGroup} reads. */
    private void check(int g) throws Damaged, Unsupported {
        int n = (int) rowGroups.get(g).rows;  // bounded by MAX_ROWS through the footer's sum
        Map<String, ObjectFooter.Chunk> chunks = chunks(g);
        for (StructField f : stored.fields()) {
            Kind kind = kind(f.name(), f.dataType());
            if (kind == Kind.HEADERS) {
                Leaf k = leaves.get("headers.key");
                if (k != null && !(nullLists(k, chunks, n)
                                   && nullLists(leaves.get("headers.value"), chunks, n))) {
                    throw new Unsupported("records with headers");
                }
            } else if (leaves.get(f.name()) != null) {
                decoder(chunks, leaves.get(f.name())).check(n);
            }
        }
        groupRows[g] = n;
        rows += n;
    }

    private ColumnarBatch decodeGroup(int g) throws Damaged, Unsupported {
        int n = (int) groupRows[g];
        Map<String, ObjectFooter.Chunk> chunks = chunks(g);
        ColumnVector[] cols = new ColumnVector[stored.size()];
        for (int i = 0; i < cols.length; i++) {
            StructField f = stored.fields()[i];
            Kind kind = kind(f.name(), f.dataType());
            Leaf leaf = leaves.get(f.name());
            // Headers were found null by check; a column the object lacks is null, as Spark
            // reads it.
            if (kind == Kind.HEADERS || leaf == null) {
                cols[i] = new DecodedVectors.Nulls(f.dataType(), n);
                continue;
            }
            PageDecoder.Column c = decoder(chunks, leaf).flat(n, kind == Kind.BYTES);
            if (kind == Kind.MILLIS) {
                for (int r = 0; r < n; r++) {
                    try {
                        c.longs[r] = Math.multiplyExact(c.longs[r], 1000L);
                    } catch (ArithmeticException e) {
                        throw new Damaged("timestamp " + c.longs[r] + " ms is out of range");
                    }
                }
                cols[i] = new DecodedVectors.Longs(f.dataType(), c);
            } else {
                cols[i] = new DecodedVectors.Binary(f.dataType(), c);
            }
        }
        return new ColumnarBatch(cols, n);
    }

    private boolean nullLists(Leaf leaf, Map<String, ObjectFooter.Chunk> chunks, int rows)
        throws Damaged, Unsupported {
        return decoder(chunks, leaf).allNullLists(rows);
    }

    private PageDecoder decoder(Map<String, ObjectFooter.Chunk> chunks, Leaf leaf)
        throws Damaged {
        ObjectFooter.Chunk c = chunks.get(leaf.path);
        if (c == null || c.type != leaf.type) {
            throw new Damaged("a row group lacks column " + leaf.path + " of its schema");
        }
        return new PageDecoder(data, c, leaf.maxDef, leaf.maxRep, budget, buffers);
    }

    long rows() {
        return rows;
    }

    int groupCount() {
        return groupRows.length;
    }

    int groupRows(int g) {
        return (int) groupRows[g];
    }

    /** Row group {@code g}, decoded; the row group decoded before it is released. A page
     * the checks did not find wanting may still be damaged. */
    ColumnarBatch group(int g) throws Damaged, Unsupported {
        if (g != currentGroup) {
            current = null;  // released before the next is decoded
            currentGroup = -1;
            if (buffers != null) {
                buffers.releasePages();
            }
            long before = budget.left;
            current = decodeGroup(g);
            currentGroup = g;
            currentBytes = before - budget.left;
        }
        return current;
    }

    /** Decompressed bytes of the row group held decoded (for tests). */
    long decodedBytesHeld() {
        return current == null ? 0 : currentBytes;
    }
}

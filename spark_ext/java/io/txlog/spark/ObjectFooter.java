package io.txlog.spark;

import java.util.ArrayList;
import java.util.List;

import io.txlog.spark.CompactReader.Damaged;

/**
 * A Parquet object's footer (its FileMetaData), read with {@link CompactReader}: the schema,
 * the row groups and their column chunks' places, codecs and counts. Fields txlog's decoder
 * has no use for are skipped whatever they hold; the values kept are checked against the
 * object's size where they locate bytes.
 */
final class ObjectFooter {
    // Parquet's enum values (parquet.thrift).
    static final int INT64 = 2;
    static final int BYTE_ARRAY = 6;
    static final int REQUIRED = 0;
    static final int OPTIONAL = 1;
    static final int REPEATED = 2;
    static final int UTF8 = 0;
    static final int LIST_TYPE = 3;
    static final int TIMESTAMP_MILLIS = 9;

    static final int MAGIC = 0x31524150;  // "PAR1", little-endian

    /** One node of the schema, in the footer's depth-first order. */
    static final class Element {
        int type = -1;
        int repetition = -1;
        String name = "";
        int children;
        int converted = -1;
        /** 0: no logical type; 1: a UTC timestamp of milliseconds; 2: string; 3: list;
         * -1: any other logical type. */
        int logical;
    }

    static final int LOGICAL_NONE = 0;
    static final int LOGICAL_TS_MILLIS_UTC = 1;
    static final int LOGICAL_STRING = 2;
    static final int LOGICAL_LIST = 3;
    static final int LOGICAL_OTHER = -1;

    static final class Chunk {
        String path = "";  // the column's dotted path
        boolean external;  // it names another file, or is encrypted: not for this decoder
        int type = -1;
        int codec = -1;
        long numValues = -1;
        long compressed = -1;
        long dataPage = -1;
        long dictionaryPage = -1;
    }

    static final class RowGroup {
        long rows = -1;
        final List<Chunk> chunks = new ArrayList<>();
    }

    final List<Element> schema = new ArrayList<>();
    final List<RowGroup> rowGroups = new ArrayList<>();
    long rows = -1;
    boolean encrypted;

    /** Reads the footer of {@code data[0, length)}; a footer that is not one is Damaged. */
    static ObjectFooter read(byte[] data, int length) throws Damaged {
        if (length < 12 || le32(data, 0) != MAGIC || le32(data, length - 4) != MAGIC) {
            throw new Damaged("not a Parquet object (no PAR1 at its start and end)");
        }
        int size = le32(data, length - 8);
        if (size <= 0 || size > length - 12) {
            throw new Damaged("its footer is said to be " + size + " bytes, in an object of "
                              + length);
        }
        int from = length - 8 - size;
        ObjectFooter f = new ObjectFooter();
        f.parse(new CompactReader(data, from, length - 8));
        f.check(from);
        return f;
    }

    static int le32(byte[] b, int at) {
        return (b[at] & 0xff) | (b[at + 1] & 0xff) << 8 | (b[at + 2] & 0xff) << 16
            | (b[at + 3] & 0xff) << 24;
    }

    private void parse(CompactReader in) throws Damaged {
        in.beginStruct();
        for (int h = in.fieldHeader(); h >= 0; h = in.fieldHeader()) {
            int t = CompactReader.type(h);
            switch (CompactReader.id(h)) {
                case 2:
                    expect(t, CompactReader.LIST);
                    int sh = in.listHeader();
                    for (int i = 0; i < sh >>> 4; i++) {
                        schema.add(element(in));
                    }
                    break;
                case 3:
                    expect(t, CompactReader.I64);
                    rows = in.readI64();
                    break;
                case 4:
                    expect(t, CompactReader.LIST);
                    int rh = in.listHeader();
                    for (int i = 0; i < rh >>> 4; i++) {
                        rowGroups.add(rowGroup(in));
                    }
                    break;
                case 8:  // encryption_algorithm
                    encrypted = true;
                    in.skip(t);
                    break;
                default:
                    in.skip(t);
            }
        }
        in.endStruct();
    }

    private static void expect(int type, int want) throws Damaged {
        if (type != want) {
            throw new Damaged("a footer field of Thrift type " + type + " where " + want
                              + " belongs");
        }
    }

    private static Element element(CompactReader in) throws Damaged {
        Element e = new Element();
        in.beginStruct();
        for (int h = in.fieldHeader(); h >= 0; h = in.fieldHeader()) {
            int t = CompactReader.type(h);
            switch (CompactReader.id(h)) {
                case 1:
                    expect(t, CompactReader.I32);
                    e.type = in.readI32();
                    break;
                case 3:
                    expect(t, CompactReader.I32);
                    e.repetition = in.readI32();
                    break;
                case 4:
                    expect(t, CompactReader.BINARY);
                    e.name = in.readString();
                    break;
                case 5:
                    expect(t, CompactReader.I32);
                    e.children = in.readI32();
                    break;
                case 6:
                    expect(t, CompactReader.I32);
                    e.converted = in.readI32();
                    break;
                case 10:
                    expect(t, CompactReader.STRUCT);
                    e.logical = logical(in);
                    break;
                default:
                    in.skip(t);
            }
        }
        in.endStruct();
        return e;
    }

    /** A LogicalType union: the kinds this decoder tells apart. */
    private static int logical(CompactReader in) throws Damaged {
        int kind = LOGICAL_OTHER;
        in.beginStruct();
        for (int h = in.fieldHeader(); h >= 0; h = in.fieldHeader()) {
            int t = CompactReader.type(h);
            int id = CompactReader.id(h);
            if (id == 1 && t == CompactReader.STRUCT) {
                kind = LOGICAL_STRING;
                in.skip(t);
            } else if (id == 3 && t == CompactReader.STRUCT) {
                kind = LOGICAL_LIST;
                in.skip(t);
            } else if (id == 8 && t == CompactReader.STRUCT) {
                kind = timestamp(in);
            } else {
                in.skip(t);
            }
        }
        in.endStruct();
        return kind;
    }

    /** A TimestampType: LOGICAL_TS_MILLIS_UTC where it is that, else LOGICAL_OTHER. */
    private static int timestamp(CompactReader in) throws Damaged {
        boolean utc = false;
        int unit = -1;
        in.beginStruct();
        for (int h = in.fieldHeader(); h >= 0; h = in.fieldHeader()) {
            int t = CompactReader.type(h);
            int id = CompactReader.id(h);
            if (id == 1 && (t == CompactReader.BOOL_TRUE || t == CompactReader.BOOL_FALSE)) {
                utc = in.readBool(t);
            } else if (id == 2 && t == CompactReader.STRUCT) {
                in.beginStruct();  // TimeUnit: a union whose field id names the unit
                for (int u = in.fieldHeader(); u >= 0; u = in.fieldHeader()) {
                    unit = CompactReader.id(u);
                    in.skip(CompactReader.type(u));
                }
                in.endStruct();
            } else {
                in.skip(t);
            }
        }
        in.endStruct();
        return utc && unit == 1 ? LOGICAL_TS_MILLIS_UTC : LOGICAL_OTHER;
    }

    private static RowGroup rowGroup(CompactReader in) throws Damaged {
        RowGroup g = new RowGroup();
        in.beginStruct();
        for (int h = in.fieldHeader(); h >= 0; h = in.fieldHeader()) {
            int t = CompactReader.type(h);
            switch (CompactReader.id(h)) {
                case 1:
                    expect(t, CompactReader.LIST);
                    int ch = in.listHeader();
                    for (int i = 0; i < ch >>> 4; i++) {
                        g.chunks.add(chunk(in));
                    }
                    break;
                case 3:
                    expect(t, CompactReader.I64);
                    g.rows = in.readI64();
                    break;
                default:
                    in.skip(t);
            }
        }
        in.endStruct();
        return g;
    }

    private static Chunk chunk(CompactReader in) throws Damaged {
        Chunk c = new Chunk();
        in.beginStruct();
        for (int h = in.fieldHeader(); h >= 0; h = in.fieldHeader()) {
            int t = CompactReader.type(h);
            switch (CompactReader.id(h)) {
                case 1:  // file_path: the chunk is in another file
                case 8:  // crypto_metadata
                case 9:  // encrypted_column_metadata
                    c.external = true;
                    in.skip(t);
                    break;
                case 3:
                    expect(t, CompactReader.STRUCT);
                    columnMeta(in, c);
                    break;
                default:
                    in.skip(t);
            }
        }
        in.endStruct();
        return c;
    }

    private static void columnMeta(CompactReader in, Chunk c) throws Damaged {
        in.beginStruct();
        for (int h = in.fieldHeader(); h >= 0; h = in.fieldHeader()) {
            int t = CompactReader.type(h);
            switch (CompactReader.id(h)) {
                case 1:
                    expect(t, CompactReader.I32);
                    c.type = in.readI32();
                    break;
                case 3: {
                    expect(t, CompactReader.LIST);
                    int lh = in.listHeader();
                    StringBuilder p = new StringBuilder();
                    for (int i = 0; i < lh >>> 4; i++) {
                        if ((lh & 0x0f) != CompactReader.BINARY) {
                            throw new Damaged("a column path that is not a list of names");
                        }
                        p.append(i == 0 ? "" : ".").append(in.readString());
                    }
                    c.path = p.toString();
                    break;
                }
                case 4:
                    expect(t, CompactReader.I32);
                    c.codec = in.readI32();
                    break;
                case 5:
                    expect(t, CompactReader.I64);
                    c.numValues = in.readI64();
                    break;
                case 7:
                    expect(t, CompactReader.I64);
                    c.compressed = in.readI64();
                    break;
                case 9:
                    expect(t, CompactReader.I64);
                    c.dataPage = in.readI64();
                    break;
                case 11:
                    expect(t, CompactReader.I64);
                    c.dictionaryPage = in.readI64();
                    break;
                default:
                    in.skip(t);
            }
        }
        in.endStruct();
    }

    /** Counts and places that do not fit the object (which ends its data at footerStart). */
    private void check(int footerStart) throws Damaged {
        if (rows < 0) {
            throw new Damaged("its footer has no row count");
        }
        long sum = 0;
        for (RowGroup g : rowGroups) {
            if (g.rows < 0) {
                throw new Damaged("a row group has no row count");
            }
            if (g.rows > Integer.MAX_VALUE) {
                throw new Damaged("a row group of " + g.rows + " rows");
            }
            sum += g.rows;  // no overflow: a list has fewer entries than the footer has bytes
            for (Chunk c : g.chunks) {
                if (c.external) {
                    continue;
                }
                long start = chunkStart(c);
                if (c.dataPage < 4 || c.compressed < 0 || start < 4
                    || start > footerStart || c.compressed > footerStart - start
                    || c.dataPage < start || c.dataPage >= start + Math.max(1, c.compressed)
                    || c.numValues < 0) {
                    throw new Damaged("column chunk " + c.path + " lies outside the object's "
                                      + "data (" + footerStart + " bytes)");
                }
            }
        }
        if (sum != rows) {
            throw new Damaged("its row groups hold " + sum + " rows, its footer says " + rows);
        }
    }

    /** Where a chunk's first page starts (its dictionary page, if it has one). */
    static long chunkStart(Chunk c) {
        return c.dictionaryPage > 0 && c.dictionaryPage < c.dataPage ? c.dictionaryPage
            : c.dataPage;
    }
}

package io.txlog.spark;

/**
 * Thrift's compact protocol, read from a byte range: the few calls a Parquet footer and its
 * page headers need, every read bounded by the range (a lying length or count is a
 * {@link Damaged}, never an index out of bounds or an allocation it asks for).
 */
final class CompactReader {
    // Compact protocol type ids.
    static final int BOOL_TRUE = 1;
    static final int BOOL_FALSE = 2;
    static final int BYTE = 3;
    static final int I16 = 4;
    static final int I32 = 5;
    static final int I64 = 6;
    static final int DOUBLE = 7;
    static final int BINARY = 8;
    static final int LIST = 9;
    static final int SET = 10;
    static final int MAP = 11;
    static final int STRUCT = 12;

    /** Nesting no Parquet footer comes near: deeper input is damaged (and would recurse). */
    private static final int MAX_DEPTH = 32;

    /** {@link #fieldHeader} at a struct's end; every field's header is non-negative. */
    static final int END = -1;

    /** The stored bytes are not what a Parquet writer writes. */
    static final class Damaged extends Exception {
        private static final long serialVersionUID = 1L;

        Damaged(String message) {
            super(message);
        }
    }

    private final byte[] buf;
    private int pos;
    private final int end;
    private int lastField;
    private final int[] fieldStack = new int[MAX_DEPTH];
    private int depth;
    private int pendingBool = -1;  // a bool field's value, carried in its header

    CompactReader(byte[] buf, int from, int end) {
        this.buf = buf;
        this.pos = from;
        this.end = end;
    }

    int position() {
        return pos;
    }

    byte[] bytes() {
        return buf;
    }

    void beginStruct() throws Damaged {
        enter();
        fieldStack[depth - 1] = lastField;
        lastField = 0;
    }

    void endStruct() {
        lastField = fieldStack[--depth];
    }

    /** Counts one more level of nesting (a struct, list, set or map): deeper is damaged. */
    private void enter() throws Damaged {
        if (depth >= MAX_DEPTH) {
            throw new Damaged("Thrift structures nested deeper than " + MAX_DEPTH);
        }
        depth++;
    }

    /** The next field's header: (id << 8) | type, or {@link #END} at the struct's end. A
     * negative id (only the long form can say one) is damaged: it would read as the end. */
    int fieldHeader() throws Damaged {
        int b = readByte() & 0xff;
        if (b == 0) {
            return END;
        }
        int type = b & 0x0f;
        int delta = b >>> 4;
        int id = delta != 0 ? lastField + delta : (short) zigzag32(varint32());
        if (id < 0) {
            throw new Damaged("a Thrift field id of " + id);
        }
        lastField = id;
        if (type == BOOL_TRUE || type == BOOL_FALSE) {
            pendingBool = type == BOOL_TRUE ? 1 : 0;
        }
        return (id << 8) | type;
    }

    static int id(int header) {
        return header >> 8;
    }

    static int type(int header) {
        return header & 0xff;
    }

    boolean readBool(int type) throws Damaged {
        if (type == BOOL_TRUE || type == BOOL_FALSE) {  // a field: the header held it
            return pendingBool == 1;
        }
        return readByte() == 1;  // an element of a list
    }

    int readI32() throws Damaged {
        return zigzag32(varint32());
    }

    long readI64() throws Damaged {
        long v = varint64();
        return (v >>> 1) ^ -(v & 1);
    }

    /** A binary's length; its bytes start at {@link #position} and are then skipped. */
    int readBinaryLength() throws Damaged {
        int n = varint32();
        if (n < 0 || n > end - pos) {
            throw new Damaged("a Thrift string of " + n + " bytes runs past its range");
        }
        return n;
    }

    String readString() throws Damaged {
        int n = readBinaryLength();
        String s = new String(buf, pos, n, java.nio.charset.StandardCharsets.UTF_8);
        pos += n;
        return s;
    }

    /** A list's header: (size << 4) | element type; the size is bounded by the bytes left. */
    int listHeader() throws Damaged {
        int b = readByte() & 0xff;
        int size = b >>> 4;
        if (size == 15) {
            size = varint32();
        }
        // Every element takes at least one byte except bools (one each too, in a list).
        if (size < 0 || size > end - pos) {
            throw new Damaged("a Thrift list of " + size + " elements runs past its range");
        }
        return (size << 4) | (b & 0x0f);
    }

    /** Skips a value of {@code type}. */
    void skip(int type) throws Damaged {
        switch (type) {
            case BOOL_TRUE:
            case BOOL_FALSE:
                return;  // a field's value is in its header
            case BYTE:
                readByte();
                return;
            case I16:
            case I32:
            case I64:
                varint64();
                return;
            case DOUBLE:
                advance(8);
                return;
            case BINARY:
                advance(readBinaryLength());
                return;
            case LIST:
            case SET: {
                int h = listHeader();
                int n = h >>> 4;
                int et = h & 0x0f;
                enter();
                for (int i = 0; i < n; i++) {
                    skipElement(et);
                }
                depth--;
                return;
            }
            case MAP: {
                int n = varint32();
                if (n < 0 || n > end - pos) {
                    throw new Damaged("a Thrift map of " + n + " entries runs past its range");
                }
                if (n == 0) {
                    return;
                }
                int kv = readByte() & 0xff;
                enter();
                for (int i = 0; i < n; i++) {
                    skipElement(kv >>> 4);
                    skipElement(kv & 0x0f);
                }
                depth--;
                return;
            }
            case STRUCT:
                beginStruct();
                for (int h = fieldHeader(); h >= 0; h = fieldHeader()) {
                    skip(type(h));
                }
                endStruct();
                return;
            default:
                throw new Damaged("unknown Thrift type " + type);
        }
    }

    private void skipElement(int type) throws Damaged {
        if (type == BOOL_TRUE || type == BOOL_FALSE) {
            readByte();  // in a list or map a bool takes a byte
        } else {
            skip(type);
        }
    }

    private void advance(int n) throws Damaged {
        if (n < 0 || n > end - pos) {
            throw new Damaged("Thrift data runs past its range");
        }
        pos += n;
    }

    private byte readByte() throws Damaged {
        if (pos >= end) {
            throw new Damaged("Thrift data ends early");
        }
        return buf[pos++];
    }

    private int varint32() throws Damaged {
        long v = varint64();
        if (v != (v & 0xffffffffL)) {
            throw new Damaged("a Thrift 32-bit integer is longer than 32 bits");
        }
        return (int) v;
    }

    private long varint64() throws Damaged {
        long v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            byte b = readByte();
            v |= (long) (b & 0x7f) << shift;
            if (b >= 0) {
                return v;
            }
        }
        throw new Damaged("a Thrift integer is longer than 64 bits");
    }

    private static int zigzag32(int n) {
        return (n >>> 1) ^ -(n & 1);
    }
}

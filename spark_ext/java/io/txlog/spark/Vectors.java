package io.txlog.spark;

import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.apache.spark.unsafe.types.UTF8String;

/** Column vectors that are views: nothing is copied per row. */
final class Vectors {
    private Vectors() {
    }

    /** Rows [offset, offset + rows) of {@code base} (itself when that is all of it). */
    static ColumnVector shift(ColumnVector base, int offset, int rows) {
        return offset == 0 ? base : new Shifted(base, offset, rows);
    }

    /** A derived column: every accessor but its own type's fails loudly. */
    abstract static class Derived extends ColumnVector {
        Derived(DataType type) {
            super(type);
        }

        private UnsupportedOperationException wrong() {
            return new UnsupportedOperationException(
                "txlog planned scan: column of type " + dataType() + " read as another type");
        }

        @Override public void close() { }
        @Override public boolean hasNull() { return false; }
        @Override public int numNulls() { return 0; }
        @Override public boolean isNullAt(int rowId) { return false; }
        @Override public boolean getBoolean(int rowId) { throw wrong(); }
        @Override public byte getByte(int rowId) { throw wrong(); }
        @Override public short getShort(int rowId) { throw wrong(); }
        @Override public int getInt(int rowId) { throw wrong(); }
        @Override public long getLong(int rowId) { throw wrong(); }
        @Override public float getFloat(int rowId) { throw wrong(); }
        @Override public double getDouble(int rowId) { throw wrong(); }
        @Override public ColumnarArray getArray(int rowId) { throw wrong(); }
        @Override public ColumnarMap getMap(int rowId) { throw wrong(); }
        @Override public Decimal getDecimal(int rowId, int precision, int scale) { throw wrong(); }
        @Override public UTF8String getUTF8String(int rowId) { throw wrong(); }
        @Override public byte[] getBinary(int rowId) { throw wrong(); }
        @Override public ColumnVector getChild(int ordinal) { throw wrong(); }
    }

    /** Row i of this vector is row i + offset of {@code base} (a slice starting mid-batch). */
    static final class Shifted extends ColumnVector {
        private final ColumnVector base;
        private final int offset;
        private final int rows;
        private ColumnVector[] children;

        Shifted(ColumnVector base, int offset, int rows) {
            super(base.dataType());
            this.base = base;
            this.offset = offset;
            this.rows = rows;
        }

        // The file reader owns and closes the base vector.
        @Override public void close() { }
        // The base's answer may count nulls outside the view: true is only ever a hint.
        @Override public boolean hasNull() { return base.hasNull(); }
        @Override public int numNulls() {
            if (!base.hasNull()) {
                return 0;
            }
            int n = 0;
            for (int i = 0; i < rows; i++) {
                if (base.isNullAt(i + offset)) {
                    n++;
                }
            }
            return n;
        }
        @Override public boolean isNullAt(int rowId) { return base.isNullAt(rowId + offset); }
        @Override public boolean getBoolean(int rowId) { return base.getBoolean(rowId + offset); }
        @Override public byte getByte(int rowId) { return base.getByte(rowId + offset); }
        @Override public short getShort(int rowId) { return base.getShort(rowId + offset); }
        @Override public int getInt(int rowId) { return base.getInt(rowId + offset); }
        @Override public long getLong(int rowId) { return base.getLong(rowId + offset); }
        @Override public float getFloat(int rowId) { return base.getFloat(rowId + offset); }
        @Override public double getDouble(int rowId) { return base.getDouble(rowId + offset); }
        @Override public ColumnarArray getArray(int rowId) { return base.getArray(rowId + offset); }
        @Override public ColumnarMap getMap(int rowId) { return base.getMap(rowId + offset); }
        @Override public Decimal getDecimal(int rowId, int precision, int scale) {
            return base.getDecimal(rowId + offset, precision, scale);
        }
        @Override public UTF8String getUTF8String(int rowId) {
            return base.getUTF8String(rowId + offset);
        }
        @Override public byte[] getBinary(int rowId) { return base.getBinary(rowId + offset); }
        // A struct's fields are read at the struct's row ids: they shift alike.
        @Override public ColumnVector getChild(int ordinal) {
            if (children == null) {
                children = new ColumnVector[((org.apache.spark.sql.types.StructType) dataType())
                    .size()];
            }
            if (children[ordinal] == null) {
                children[ordinal] = new Shifted(base.getChild(ordinal), offset, rows);
            }
            return children[ordinal];
        }
    }

    static final class ConstString extends Derived {
        private final UTF8String value;

        ConstString(DataType type, UTF8String value) {
            super(type);
            this.value = value;
        }

        @Override public UTF8String getUTF8String(int rowId) { return value; }
    }

    static final class ConstInt extends Derived {
        private final int value;

        ConstInt(DataType type, int value) {
            super(type);
            this.value = value;
        }

        @Override public int getInt(int rowId) { return value; }
    }

    /** {@code first + step * rowId}: offsets (step 1), or one append time (step 0). */
    static final class LongSequence extends Derived {
        private final long first;
        private final long step;

        LongSequence(DataType type, long first, long step) {
            super(type);
            this.first = first;
            this.step = step;
        }

        @Override public long getLong(int rowId) { return first + step * rowId; }
    }

    /** A record's own timestamp, or the append time where it has none (Kafka's LogAppendTime). */
    static final class LongOr extends Derived {
        private final ColumnVector base;
        private final long fallback;

        LongOr(DataType type, ColumnVector base, long fallback) {
            super(type);
            this.base = base;
            this.fallback = fallback;
        }

        @Override public long getLong(int rowId) {
            return base.isNullAt(rowId) ? fallback : base.getLong(rowId);
        }
    }

    /** Kafka's timestampType: 0 (CreateTime) where the record has a timestamp, else 1. */
    static final class NullFlag extends Derived {
        private final ColumnVector base;

        NullFlag(DataType type, ColumnVector base) {
            super(type);
            this.base = base;
        }

        @Override public int getInt(int rowId) { return base.isNullAt(rowId) ? 1 : 0; }
    }
}

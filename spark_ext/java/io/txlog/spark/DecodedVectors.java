package io.txlog.spark;

import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.unsafe.types.UTF8String;

/** Column vectors over a batch object's decoded pages: a binary value is read where its
 * page (or dictionary) holds it, without being copied into a vector first. */
final class DecodedVectors {
    private DecodedVectors() {
    }

    /** Binary values: row i is {@code length[i]} bytes of {@code base[i]} at {@code start[i]}. */
    static final class Binary extends Vectors.Derived {
        private final PageDecoder.Column c;

        Binary(DataType type, PageDecoder.Column c) {
            super(type);
            this.c = c;
        }

        @Override public boolean hasNull() { return c.nullCount > 0; }
        @Override public int numNulls() { return c.nullCount; }
        @Override public boolean isNullAt(int rowId) { return c.nulls[rowId]; }
        @Override public byte[] getBinary(int rowId) {
            if (c.nulls[rowId]) {
                return null;
            }
            int from = c.start[rowId];
            return java.util.Arrays.copyOfRange(c.base[rowId], from, from + c.length[rowId]);
        }
        @Override public UTF8String getUTF8String(int rowId) {
            return c.nulls[rowId] ? null
                : UTF8String.fromBytes(c.base[rowId], c.start[rowId], c.length[rowId]);
        }
    }

    /** 64-bit values (timestamps, in microseconds as Spark holds them). */
    static final class Longs extends Vectors.Derived {
        private final PageDecoder.Column c;

        Longs(DataType type, PageDecoder.Column c) {
            super(type);
            this.c = c;
        }

        @Override public boolean hasNull() { return c.nullCount > 0; }
        @Override public int numNulls() { return c.nullCount; }
        @Override public boolean isNullAt(int rowId) { return c.nulls[rowId]; }
        @Override public long getLong(int rowId) { return c.longs[rowId]; }
    }

    /** A column that is null in every row (headers no record has, a column the object lacks). */
    static final class Nulls extends Vectors.Derived {
        private final int rows;

        Nulls(DataType type, int rows) {
            super(type);
            this.rows = rows;
        }

        @Override public boolean hasNull() { return rows > 0; }
        @Override public int numNulls() { return rows; }
        @Override public boolean isNullAt(int rowId) { return true; }
    }
}

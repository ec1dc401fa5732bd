package io.txlog.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A written row seen as the staged writer's columns (key, value[, timestamp][, partition])
 * without copying it: {@code format("txlog")} writes take the DataFrame's columns in any
 * order, with or without a key, and a partition column of any integer type.
 */
final class InputColumns extends GenericInternalRow {
    private static final long serialVersionUID = 1L;

    /** The input ordinal of each staged column; -1: always null (a DataFrame without key). */
    private final int[] ordinals;
    /** The staged column that is the partition, or -1. */
    private final int partition;
    /** The byte width of the input's partition column (1, 2, 4 or 8). */
    private final int partitionWidth;
    private InternalRow row;

    InputColumns(int[] ordinals, int partition, int partitionWidth) {
        super(ordinals.length);
        this.ordinals = ordinals.clone();
        this.partition = partition;
        this.partitionWidth = partitionWidth;
    }

    InputColumns of(InternalRow r) {
        this.row = r;
        return this;
    }

    @Override public int numFields() { return ordinals.length; }
    @Override public void setNullAt(int i) { throw new UnsupportedOperationException(); }
    @Override public void update(int i, Object value) { throw new UnsupportedOperationException(); }
    @Override public GenericInternalRow copy() {
        return new InputColumns(ordinals, partition, partitionWidth).of(row.copy());
    }
    @Override public Object genericGet(int i) { throw new UnsupportedOperationException(); }
    @Override public boolean isNullAt(int i) { return ordinals[i] < 0 || row.isNullAt(ordinals[i]); }
    @Override public int getInt(int i) {
        if (i == partition && partitionWidth == 2) {
            return row.getShort(ordinals[i]);
        }
        if (i == partition && partitionWidth == 1) {
            return row.getByte(ordinals[i]);
        }
        return row.getInt(ordinals[i]);
    }
    @Override public long getLong(int i) { return row.getLong(ordinals[i]); }
    @Override public UTF8String getUTF8String(int i) { return row.getUTF8String(ordinals[i]); }
    @Override public byte[] getBinary(int i) { return row.getBinary(ordinals[i]); }
    @Override public Object get(int i, DataType type) {
        return ordinals[i] < 0 ? null : row.get(ordinals[i], type);
    }
}

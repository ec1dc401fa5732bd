package io.txlog.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The stored columns of an input row, as the Parquet writer takes them: the first
 * {@code n} columns (a routing column follows), with string columns read as their UTF-8
 * bytes, so a string key is written as Kafka's binary key without a cast per row.
 *
 * <p>It extends GenericInternalRow rather than InternalRow: the getters Spark adds from
 * one release to the next (4.3's nanosecond timestamps) then have an implementation on
 * every release, so the same source compiles against Spark 4.2 and 4.3.
 */
final class StoredRow extends GenericInternalRow {
    private static final long serialVersionUID = 1L;

    private final boolean[] strings;
    private InternalRow row;

    StoredRow(boolean[] strings) {
        super(strings.length);
        this.strings = strings;
    }

    StoredRow of(InternalRow r) {
        this.row = r;
        return this;
    }

    @Override public int numFields() { return strings.length; }
    @Override public void setNullAt(int i) { throw new UnsupportedOperationException(); }
    @Override public void update(int i, Object value) { throw new UnsupportedOperationException(); }
    @Override public GenericInternalRow copy() { return new StoredRow(strings).of(row.copy()); }
    @Override public Object genericGet(int i) { throw new UnsupportedOperationException(); }
    @Override public boolean isNullAt(int i) { return row.isNullAt(i); }
    @Override public boolean getBoolean(int i) { return row.getBoolean(i); }
    @Override public byte getByte(int i) { return row.getByte(i); }
    @Override public short getShort(int i) { return row.getShort(i); }
    @Override public int getInt(int i) { return row.getInt(i); }
    @Override public long getLong(int i) { return row.getLong(i); }
    @Override public float getFloat(int i) { return row.getFloat(i); }
    @Override public double getDouble(int i) { return row.getDouble(i); }
    @Override public Decimal getDecimal(int i, int p, int s) { return row.getDecimal(i, p, s); }
    @Override public UTF8String getUTF8String(int i) { return row.getUTF8String(i); }
    @Override public byte[] getBinary(int i) {
        return strings[i] ? row.getUTF8String(i).getBytes() : row.getBinary(i);
    }
    @Override public InternalRow getStruct(int i, int fields) { return row.getStruct(i, fields); }
    @Override public ArrayData getArray(int i) { return row.getArray(i); }
    @Override public MapData getMap(int i) { return row.getMap(i); }
    @Override public Object get(int i, DataType type) { return row.get(i, type); }
}

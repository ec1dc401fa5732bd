package io.txlog.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.unsafe.types.UTF8String;
import org.junit.jupiter.api.Test;

class InputColumnsTest {
    @Test
    void columnsAreFoundWhereverTheRowHasThem() {
        // written row: (partition short, value string, extra, timestamp); no key column
        GenericInternalRow written = new GenericInternalRow(new Object[] {
            (short) 7, UTF8String.fromString("v"), 42, 1_000_000L});
        InputColumns view = new InputColumns(new int[] {-1, 1, 3, 0}, 3, 2).of(written);
        assertEquals(4, view.numFields());
        assertTrue(view.isNullAt(0));
        assertEquals("v", view.getUTF8String(1).toString());
        assertEquals(1_000_000L, view.getLong(2));
        assertEquals(7, view.getInt(3));
        StoredRow stored = new StoredRow(new boolean[] {false, true}).of(view);
        assertArrayEquals(new byte[] {'v'}, stored.getBinary(1));
        assertEquals(2, stored.numFields());
    }
}

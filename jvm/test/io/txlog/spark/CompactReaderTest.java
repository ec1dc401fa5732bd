package io.txlog.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.Arrays;
import org.junit.jupiter.api.Test;

/** Hostile Thrift input: refused as damaged, never a stack overflow or a misaligned parse. */
class CompactReaderTest {
    @Test
    void deeplyNestedListsAreDamagedNotAStackOverflow() {
        // A list of one list of one list ... (element type LIST, size 1: byte 0x19), far
        // deeper than any footer nests.
        byte[] data = new byte[200_000];
        Arrays.fill(data, (byte) 0x19);
        CompactReader in = new CompactReader(data, 0, data.length);
        assertThrows(CompactReader.Damaged.class, () -> in.skip(CompactReader.LIST));
    }

    @Test
    void deeplyNestedMapsAreDamagedNotAStackOverflow() {
        // A map of one entry whose key is a byte and whose value is a map, repeated.
        byte[] data = new byte[300_000];
        for (int i = 0; i + 2 < data.length; i += 3) {
            data[i] = 0x01;      // one entry
            data[i + 1] = 0x3b;  // key BYTE, value MAP
            data[i + 2] = 0x00;  // the key
        }
        CompactReader in = new CompactReader(data, 0, data.length);
        assertThrows(CompactReader.Damaged.class, () -> in.skip(CompactReader.MAP));
    }

    @Test
    void nestingWithinTheLimitIsSkipped() throws Exception {
        byte[] data = {0x19, 0x19, 0x19, 0x15, 0x02, 0x07};  // list<list<list<i32>>>: [[[1]]]
        CompactReader in = new CompactReader(data, 0, data.length);
        in.skip(CompactReader.LIST);
        assertEquals(5, in.position());
    }

    @Test
    void aNegativeFieldIdIsDamagedNotTheStructsEnd() throws Exception {
        // Long form: type I32 with a zero delta, then the id as a zigzag varint (1 is -1).
        byte[] data = {0x05, 0x01, 0x02, 0x00};
        CompactReader in = new CompactReader(data, 0, data.length);
        in.beginStruct();
        assertThrows(CompactReader.Damaged.class, in::fieldHeader);
    }

    @Test
    void theStructsEndIsDistinctFromEveryField() throws Exception {
        byte[] data = {0x05, 0x00, 0x02, 0x15, 0x04, 0x00};  // field 0 (long form), field 1, end
        CompactReader in = new CompactReader(data, 0, data.length);
        in.beginStruct();
        int h = in.fieldHeader();
        assertEquals(0, CompactReader.id(h));
        assertEquals(1, in.readI32());
        h = in.fieldHeader();
        assertEquals(1, CompactReader.id(h));
        assertEquals(2, in.readI32());
        assertEquals(CompactReader.END, in.fieldHeader());
    }
}

package io.txlog.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

class StreamOffsetTest {
    @Test
    void offsetsWrittenDifferentlyAreOneOffset() {
        // As Python's json.dumps writes it (a checkpoint of the Python source), and as the
        // planner answers: Spark compares the text.
        StreamOffset python =
            StreamOffset.parse("{\"orders\": {\"1\": 7, \"0\": 23}, \"$initial\": true}");
        StreamOffset planner =
            StreamOffset.parse("{\"$initial\":true,\"orders\":{\"0\":23,\"1\":7}}");
        assertEquals(planner.json(), python.json());
        assertEquals(planner, python);
        assertEquals("{\"$initial\":true,\"orders\":{\"0\":23,\"1\":7}}", python.json());
    }

    @Test
    void anotherSourcesOffsetIsRefusedWithWhatToDo() {
        TxlogException e = assertThrows(TxlogException.class, () -> StreamOffset.parse("42"));
        assertTrue(e.getMessage().contains("new checkpointLocation"), e.getMessage());
        assertThrows(TxlogException.class, () -> StreamOffset.parse("{not json"));
    }
}

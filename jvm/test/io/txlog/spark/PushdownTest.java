package io.txlog.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Timestamp;
import java.time.Instant;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import org.apache.spark.sql.sources.And;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.IsNotNull;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.Or;
import org.junit.jupiter.api.Test;

class PushdownTest {
    private static ArrayNode empty() {
        return new ObjectMapper().createArrayNode();
    }

    @Test
    void partitionOffsetAndTopicFiltersArePushed() {
        ArrayNode out = empty();
        assertTrue(Pushdown.add(new And(new EqualTo("partition", 3),
                                        new GreaterThanOrEqual("offset", 10L)), out));
        assertTrue(Pushdown.add(new In("topic", new Object[] {"a", "b"}), out));
        assertEquals("[{\"column\":\"partition\",\"op\":\"eq\",\"values\":[3]},"
                         + "{\"column\":\"offset\",\"op\":\"ge\",\"values\":[10]},"
                         + "{\"column\":\"topic\",\"op\":\"in\",\"values\":[\"a\",\"b\"]}]",
                     out.toString());
    }

    @Test
    void timestampsAreMicroseconds() {
        ArrayNode out = empty();
        Timestamp t = Timestamp.from(Instant.ofEpochSecond(-2, 1_500_000));  // before 1970
        assertTrue(Pushdown.add(new LessThan("timestamp", t), out));
        assertTrue(Pushdown.add(new LessThan("timestamp", Instant.ofEpochSecond(5, 7000)), out));
        assertEquals(-2_000_000L + 1_500, out.get(0).get("values").get(0).asLong());
        assertEquals(5_000_007L, out.get(1).get("values").get(0).asLong());
    }

    @Test
    void otherFiltersStayWithSpark() {
        ArrayNode out = empty();
        assertFalse(Pushdown.add(new EqualTo("value", 1), out));
        assertFalse(Pushdown.add(new IsNotNull("partition"), out));
        assertFalse(Pushdown.add(new Or(new EqualTo("partition", 1), new EqualTo("partition", 2)),
                                 out));
        assertFalse(Pushdown.add(new EqualTo("partition", "1"), out));
        assertFalse(Pushdown.add(new In("partition", new Object[] {1, null}), out));
        // half of an AND is not pushed alone: the planner would read it as the whole
        assertFalse(Pushdown.add(new And(new EqualTo("partition", 1), new EqualTo("value", 2)),
                                 out));
        assertEquals(0, out.size());
    }
}

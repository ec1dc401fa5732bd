package io.txlog.spark;

import java.sql.Timestamp;
import java.time.Instant;
import java.util.List;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.sources.And;
import org.apache.spark.sql.sources.EqualNullSafe;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;

/**
 * Filters on topic, partition, offset and timestamp as the planner takes them
 * ({@code spark_ext/pushdown.py}): {@code {"column": ..., "op": eq|lt|le|gt|ge|in,
 * "values": [...]}}, timestamps in microseconds. Others are not pushed. The planner only
 * prunes batch objects that cannot hold a matching row; Spark still applies every filter.
 */
final class Pushdown {
    private static final ObjectMapper JSON = new ObjectMapper();

    private Pushdown() {
    }

    /** Adds the planner's form of {@code f} to {@code out}; false when it has none. */
    static boolean add(Filter f, ArrayNode out) {
        if (f instanceof And) {
            And a = (And) f;
            ArrayNode both = JSON.createArrayNode();
            if (add(a.left(), both) && add(a.right(), both)) {
                out.addAll(both);
                return true;
            }
            return false;
        }
        String column;
        String op;
        Object[] values;
        if (f instanceof EqualTo) {
            column = ((EqualTo) f).attribute();
            op = "eq";
            values = new Object[] {((EqualTo) f).value()};
        } else if (f instanceof EqualNullSafe) {
            column = ((EqualNullSafe) f).attribute();
            op = "eq";
            values = new Object[] {((EqualNullSafe) f).value()};
        } else if (f instanceof GreaterThan) {
            column = ((GreaterThan) f).attribute();
            op = "gt";
            values = new Object[] {((GreaterThan) f).value()};
        } else if (f instanceof GreaterThanOrEqual) {
            column = ((GreaterThanOrEqual) f).attribute();
            op = "ge";
            values = new Object[] {((GreaterThanOrEqual) f).value()};
        } else if (f instanceof LessThan) {
            column = ((LessThan) f).attribute();
            op = "lt";
            values = new Object[] {((LessThan) f).value()};
        } else if (f instanceof LessThanOrEqual) {
            column = ((LessThanOrEqual) f).attribute();
            op = "le";
            values = new Object[] {((LessThanOrEqual) f).value()};
        } else if (f instanceof In) {
            column = ((In) f).attribute();
            op = "in";
            values = ((In) f).values();
        } else {
            return false;
        }
        if (!List.of("topic", "partition", "offset", "timestamp").contains(column)) {
            return false;
        }
        ObjectNode node = JSON.createObjectNode();
        node.put("column", column);
        node.put("op", op);
        ArrayNode vs = node.putArray("values");
        for (Object v : values) {
            if (v == null) {
                return false;  // x = NULL matches nothing, x IN (.., NULL): leave it to Spark
            } else if ("topic".equals(column) && v instanceof String) {
                vs.add((String) v);
            } else if (("partition".equals(column) || "offset".equals(column))
                       && (v instanceof Integer || v instanceof Long || v instanceof Short
                           || v instanceof Byte)) {
                vs.add(((Number) v).longValue());
            } else if ("timestamp".equals(column) && v instanceof Timestamp) {
                Timestamp t = (Timestamp) v;
                vs.add(Math.floorDiv(t.getTime(), 1000L) * 1_000_000L + t.getNanos() / 1000);
            } else if ("timestamp".equals(column) && v instanceof Instant) {
                Instant t = (Instant) v;
                vs.add(t.getEpochSecond() * 1_000_000L + t.getNano() / 1000);
            } else {
                return false;
            }
        }
        out.add(node);
        return true;
    }
}

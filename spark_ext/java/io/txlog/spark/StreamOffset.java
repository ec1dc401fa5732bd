package io.txlog.spark;

import java.io.IOException;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.SerializationFeature;
import org.apache.spark.sql.connector.read.streaming.Offset;

/**
 * A streaming position of a txlog read: Kafka's offset JSON ({@code {"orders": {"0": 42}}}),
 * as txlog's planner computes it and the Python data source checkpoints it.
 *
 * <p>Spark decides whether a micro-batch has data by comparing offsets as JSON text, so the
 * text is kept in one canonical form (keys sorted, no spaces) whoever wrote it.
 */
final class StreamOffset extends Offset {
    private static final ObjectMapper JSON = new ObjectMapper()
        .enable(SerializationFeature.ORDER_MAP_ENTRIES_BY_KEYS);

    private final String json;

    private StreamOffset(String json) {
        this.json = json;
    }

    /** The offset that {@code json} describes, in canonical form. */
    static StreamOffset parse(String json) {
        Object value;
        try {
            value = JSON.readValue(json, Object.class);
        } catch (IOException e) {
            value = null;
        }
        if (!(value instanceof java.util.Map)) {
            throw new TxlogException("txlog.errors.ConfigError",
                "a streaming offset of this query is not txlog's JSON object: " + json
                    + "; the checkpoint belongs to another source: start the query with a "
                    + "new checkpointLocation");
        }
        try {
            return new StreamOffset(JSON.writeValueAsString(value));
        } catch (IOException e) {
            throw new IllegalStateException("txlog: cannot encode an offset: " + e, e);
        }
    }

    @Override
    public String json() {
        return json;
    }
}

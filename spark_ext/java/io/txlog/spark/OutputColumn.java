package io.txlog.spark;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/** Where one output column comes from: a stored column, or a value txlog derives. */
final class OutputColumn implements Serializable {
    private static final long serialVersionUID = 1L;

    enum Source { STORED, TOPIC, PARTITION, OFFSET, KAFKA_TIMESTAMP, TIMESTAMP_TYPE, APPEND_TIME }

    final String name;
    final DataType type;
    final Source source;
    /** Index among the stored columns read from the object (for STORED, KAFKA_TIMESTAMP and
     * TIMESTAMP_TYPE: the object's own timestamp column), or -1. */
    final int stored;

    private OutputColumn(String name, DataType type, Source source, int stored) {
        this.name = name;
        this.type = type;
        this.source = source;
        this.stored = stored;
    }

    /** The output columns of a read of {@code schema}, and (by their {@code stored} index)
     * the list of stored columns to read, which {@link #storedNames} returns. */
    static List<OutputColumn> plan(StructType schema, boolean kafka) {
        List<String> stored = new ArrayList<>();
        List<OutputColumn> out = new ArrayList<>();
        for (StructField f : schema.fields()) {
            String n = f.name();
            Source src;
            if (n.equals("topic")) {
                src = Source.TOPIC;
            } else if (n.equals("partition")) {
                src = Source.PARTITION;
            } else if (n.equals("offset")) {
                src = Source.OFFSET;
            } else if (n.equals("timestamp")) {
                src = kafka ? Source.KAFKA_TIMESTAMP : Source.APPEND_TIME;
            } else if (n.equals("timestampType") && kafka) {
                src = Source.TIMESTAMP_TYPE;
            } else {
                src = Source.STORED;
            }
            String column = src == Source.STORED ? n
                : (src == Source.KAFKA_TIMESTAMP || src == Source.TIMESTAMP_TYPE) ? "timestamp"
                : null;
            int index = -1;
            if (column != null) {
                index = stored.indexOf(column);
                if (index < 0) {
                    stored.add(column);
                    index = stored.size() - 1;
                }
            }
            out.add(new OutputColumn(n, f.dataType(), src, index));
        }
        return out;
    }

    /** The Spark schema of the stored columns read (in {@code stored} index order). */
    static StructType storedSchema(List<OutputColumn> columns) {
        List<String> names = storedNames(columns);
        StructField[] fields = new StructField[names.size()];
        for (OutputColumn c : columns) {
            if (c.stored >= 0 && fields[c.stored] == null) {
                // A Kafka record's own timestamp is read as a timestamp, whichever of the
                // columns derived from it (timestamp, timestampType) asked for it.
                DataType type = c.source == Source.STORED ? c.type : DataTypes.TimestampType;
                fields[c.stored] = new StructField(names.get(c.stored), type, true,
                                                   org.apache.spark.sql.types.Metadata.empty());
            }
        }
        return new StructType(fields);
    }

    static List<String> storedNames(List<OutputColumn> columns) {
        List<String> names = new ArrayList<>();
        for (OutputColumn c : columns) {
            if (c.stored < 0) {
                continue;
            }
            String column = c.source == Source.STORED ? c.name : "timestamp";
            while (names.size() <= c.stored) {
                names.add(null);
            }
            names.set(c.stored, column);
        }
        return names;
    }
}

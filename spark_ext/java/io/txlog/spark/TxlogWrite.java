package io.txlog.spark;

import java.util.HashMap;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.SupportsTruncate;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A batch write of {@code format("txlog")}: the planner decides whether the JVM writer
 * takes it ({@code write_begin}); tasks stage Parquet objects as {@link StagedWriteProvider}
 * does, and {@link BatchWrite#commit} has the planner append them and commit the one
 * transaction ({@code write_commit}); a streaming write is a {@link TxlogStreamingWrite}.
 * Other writes and truncation go to txlog's Python data source.
 */
final class TxlogWrite implements Write {
    private static final Logger LOG = LoggerFactory.getLogger(TxlogWrite.class);

    private final TxlogTable table;
    private final LogicalWriteInfo info;
    private final boolean truncate;

    private TxlogWrite(TxlogTable table, LogicalWriteInfo info, boolean truncate) {
        this.table = table;
        this.info = info;
        this.truncate = truncate;
    }

    static final class Builder implements WriteBuilder, SupportsTruncate {
        private final TxlogTable table;
        private final LogicalWriteInfo info;
        private boolean truncate;

        Builder(TxlogTable table, LogicalWriteInfo info) {
            this.table = table;
            this.info = info;
        }

        @Override
        public WriteBuilder truncate() {
            truncate = true;
            return this;
        }

        @Override
        public Write build() {
            return new TxlogWrite(table, info, truncate);
        }
    }

    private Write python() {
        WriteBuilder b = ((org.apache.spark.sql.connector.catalog.SupportsWrite) table.python())
            .newWriteBuilder(info);
        if (truncate) {
            b = ((SupportsTruncate) b).truncate();  // the Python source says what it does
        }
        return b.build();
    }

    @Override
    public String description() {
        return "txlog write " + TxlogTable.describe(table.options(info.options()));
    }

    @Override
    public String toString() {
        return description();
    }

    @Override
    public BatchWrite toBatch() {
        if (truncate) {
            return python().toBatch();
        }
        Map<String, String> options = table.options(info.options());
        String why = table.unreachable(options);
        if (why != null) {
            LOG.info("txlog: format(\"txlog\") write through txlog's Python data source: {}",
                     why);
            return python().toBatch();
        }
        ObjectNode req = Planner.request("write_begin");
        req.set("options", Planner.options(options));
        req.put("schema", info.schema().json());
        JsonNode answer = Planner.call(req);
        if (answer.has("fallback")) {
            LOG.info("txlog: format(\"txlog\") write through txlog's Python data source: {}",
                     answer.get("fallback").asText());
            return python().toBatch();
        }
        HadoopSettings.apply(answer.get("hadoopConf"));
        LOG.info("txlog: format(\"txlog\") write through the JVM connector");
        return new Committed(spec(answer, info.schema()));
    }

    @Override
    public StreamingWrite toStreaming() {
        if (truncate) {
            return python().toStreaming();
        }
        return TxlogStreamingWrite.of(table, info, this::python);
    }

    /** The staged writer's settings, and where its columns are in the written rows. */
    static StagedWriteProvider.Spec spec(JsonNode answer, StructType input) {
        Map<String, String> o = new HashMap<>();
        answer.get("spec").fields().forEachRemaining(e -> o.put(e.getKey(), e.getValue().asText()));
        String[] names = {"key", "value", "timestamp", "partition"};
        StructType logical = new StructType();
        int[] ordinals = new int[names.length];
        int n = 0;
        int width = 4;
        for (String name : names) {
            int at = input.getFieldIndex(name).isDefined()
                ? (Integer) input.getFieldIndex(name).get() : -1;
            if (at < 0 && !"key".equals(name)) {
                continue;  // a keyless write still has a key column: null
            }
            DataType type = at < 0 ? org.apache.spark.sql.types.DataTypes.BinaryType
                : input.fields()[at].dataType();
            if ("partition".equals(name)) {
                width = type instanceof LongType ? 8 : type instanceof ShortType ? 2
                    : type instanceof ByteType ? 1 : 4;
                if (!(type instanceof LongType)) {
                    type = org.apache.spark.sql.types.DataTypes.IntegerType;
                }
            }
            if (("key".equals(name) || "value".equals(name)) && type instanceof StringType) {
                type = org.apache.spark.sql.types.DataTypes.StringType;
            }
            logical = logical.add(new StructField(name, type, true,
                                                  org.apache.spark.sql.types.Metadata.empty()));
            ordinals[n++] = at;
        }
        int[] used = new int[n];
        System.arraycopy(ordinals, 0, used, 0, n);
        return StagedWriteProvider.Spec.mapped(o, logical, used, width);
    }

    /** The JVM writer's batch write, committed by the planner. */
    static final class Committed extends StagedWriteProvider.StagedBatchWrite {
        Committed(StagedWriteProvider.Spec spec) {
            super(spec);
        }

        @Override
        public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
            return factory(spec);
        }

        @Override
        public void commit(WriterCommitMessage[] messages) {
            ObjectNode req = Planner.request("write_commit");
            req.put("staging", spec.staging);
            req.put("staged", StagedWriter.Staged.joined(messages));
            Planner.call(req);
        }

        @Override
        public void abort(WriterCommitMessage[] messages) {
            // Tasks deleted what they wrote; the planner sweeps the staging folder.
            ObjectNode req = Planner.request("write_abort");
            req.put("staging", spec.staging);
            Planner.call(req);
        }
    }
}

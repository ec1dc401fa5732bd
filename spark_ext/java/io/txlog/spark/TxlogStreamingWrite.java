package io.txlog.spark;

import java.util.Map;
import java.util.function.Supplier;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code writeStream.format("txlog")} in the JVM: every micro-batch (epoch) is one txlog
 * transaction. Its tasks stage Parquet objects as a batch write's do; its commit has the
 * planner append them and commit them with the app version {@code stream-<query id>} =
 * the batch id (or the {@code txnAppId} option), so a batch Spark replays after a crash
 * commits nothing new, exactly as the Python source's stream writer (the two share the
 * app id, and a query's checkpoint moves between them).
 */
final class TxlogStreamingWrite implements StreamingWrite {
    private static final Logger LOG = LoggerFactory.getLogger(TxlogStreamingWrite.class);

    private final Map<String, String> options;
    private final LogicalWriteInfo info;
    /** The write of the micro-batch in progress (Spark runs one at a time per query). */
    private StagedWriteProvider.Spec current;

    private TxlogStreamingWrite(Map<String, String> options, LogicalWriteInfo info) {
        this.options = options;
        this.info = info;
    }

    /** The streaming write of {@code info}: this class's, or the Python source's when
     * the JVM writer does not take the rows (the planner says why) or Spark cannot open
     * the root. */
    static StreamingWrite of(TxlogTable table, LogicalWriteInfo info, Supplier<Write> python) {
        Map<String, String> options = table.options(info.options());
        String why = table.unreachable(options);
        if (why == null) {
            // Checked only: a write is begun (an entry the planner keeps until its commit or
            // abort) when a micro-batch runs, as Spark plans writes that never run.
            JsonNode checked = call("stream_write_check", options, info);
            if (checked.has("fallback")) {
                why = checked.get("fallback").asText();
            }
        }
        if (why != null) {
            LOG.info("txlog: format(\"txlog\") streaming write through txlog's Python data "
                + "source: {}", why);
            return python.get().toStreaming();
        }
        TxlogStreamingWrite w = new TxlogStreamingWrite(options, info);
        LOG.info("txlog: format(\"txlog\") streaming write through the JVM connector: {}", w);
        return w;
    }

    private static JsonNode call(String op, Map<String, String> options, LogicalWriteInfo info) {
        ObjectNode req = Planner.request(op);
        req.set("options", Planner.options(options));
        req.put("schema", info.schema().json());
        return Planner.call(req);
    }

    @Override
    public synchronized StreamingDataWriterFactory createStreamingWriterFactory(
            PhysicalWriteInfo physical) {
        JsonNode begun = call("stream_write_begin", options, info);
        if (begun.has("fallback")) {  // the topic changed kind since the query started
            throw new TxlogException("txlog.errors.ConfigError",
                "the JVM writer no longer takes this streaming write ("
                    + begun.get("fallback").asText() + "); restart the query");
        }
        HadoopSettings.apply(begun.get("hadoopConf"));
        current = TxlogWrite.spec(begun, info.schema());
        return new Factory(StagedWriteProvider.StagedBatchWrite.factory(current));
    }

    @Override
    public synchronized void commit(long epochId, WriterCommitMessage[] messages) {
        StagedWriteProvider.Spec spec = ongoing(epochId);
        ObjectNode req = Planner.request("stream_write_commit");
        req.put("staging", spec.staging);
        req.put("staged", StagedWriter.Staged.joined(messages));
        req.put("queryId", info.queryId());
        req.put("epoch", epochId);
        current = null;
        Planner.call(req);
    }

    @Override
    public synchronized void abort(long epochId, WriterCommitMessage[] messages) {
        if (current == null) {
            return;  // the commit failed: the planner settled and swept it already
        }
        // Tasks deleted what they wrote; the planner sweeps the staging folder.
        ObjectNode req = Planner.request("write_abort");
        req.put("staging", current.staging);
        current = null;
        Planner.call(req);
    }

    private StagedWriteProvider.Spec ongoing(long epochId) {
        if (current == null) {
            throw new IllegalStateException("txlog: micro-batch " + epochId
                + " is committed without a write begun for it");
        }
        return current;
    }

    @Override
    public String toString() {
        return "txlog JVM streaming write " + TxlogTable.describe(options);
    }

    /** Spark's streaming tasks name their epoch; the staged writer needs only the task. */
    static final class Factory implements StreamingDataWriterFactory {
        private static final long serialVersionUID = 1L;

        private final DataWriterFactory files;

        Factory(DataWriterFactory files) {
            this.files = files;
        }

        @Override
        public DataWriter<InternalRow> createWriter(int partitionId, long taskId, long epochId) {
            return files.createWriter(partitionId, taskId);
        }
    }
}

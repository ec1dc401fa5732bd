package io.txlog.spark;

import java.util.List;

import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.util.SerializableConfiguration;

final class SliceReaderFactory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;

    private final List<OutputColumn> columns;
    private final int batchSize;
    private final boolean failOnDataLoss;
    private final Broadcast<SerializableConfiguration> conf;

    SliceReaderFactory(List<OutputColumn> columns, int batchSize, boolean failOnDataLoss,
                       Broadcast<SerializableConfiguration> conf) {
        this.columns = columns;
        this.batchSize = batchSize;
        this.failOnDataLoss = failOnDataLoss;
        this.conf = conf;
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
        return true;
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
        return new SliceReader((SlicePartition) partition, columns, batchSize, failOnDataLoss,
                               conf.value().value());
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
        throw new UnsupportedOperationException("txlog planned scan reads columnar batches only");
    }
}

package io.txlog.spark;

import java.util.List;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.types.StructType;

/** Readers of hand-made slices for the scan's tests: one slice per row of
 * {path, base, skip, take, object bytes}, all of partition 0 of topic "t". */
final class TestSlices {
    private TestSlices() {
    }

    /** A reader of {@code slices} returning the columns of {@code read}, with the reader
     * settings of {@code base} and every batch appended at {@code appendMs}. */
    static SliceReader reader(List<String[]> slices, int batchSize, Configuration base,
                              StructType read, long appendMs) {
        List<OutputColumn> columns = OutputColumn.plan(read, true);
        Configuration conf = PlannedScanProvider.readerConf(base, columns);
        SlicePartition part = SlicePartition.ofSize(slices.size());
        for (int i = 0; i < slices.size(); i++) {
            String[] f = slices.get(i);
            part.paths[i] = f[0];
            part.topics[i] = "t";
            part.partitions[i] = 0;
            part.bases[i] = Long.parseLong(f[1]);
            part.skips[i] = Long.parseLong(f[2]);
            part.takes[i] = Long.parseLong(f[3]);
            part.appendMs[i] = appendMs;
            part.objectBytes[i] = Long.parseLong(f[4]);
            part.addBytes(Long.parseLong(f[4]));
        }
        return new SliceReader(part, columns, batchSize, true, conf);
    }
}

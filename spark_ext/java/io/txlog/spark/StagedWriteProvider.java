package io.txlog.spark;

import java.io.IOException;
import java.io.Serializable;
import java.util.EnumSet;
import java.util.Map;
import java.util.Set;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.mapreduce.Job;
import org.apache.spark.SparkContext;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.execution.datasources.OutputWriterFactory;
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.util.SerializableConfiguration;

/**
 * Stages a DataFrame's rows as txlog batch objects for one topic (spark_ext/jvm_write.py).
 *
 * <p>Each task routes its rows to the topic's partitions (an explicit partition column,
 * else Kafka's murmur2 of the key, else a sticky partition) and writes one Parquet object
 * per partition with Spark's own Parquet writer into the write's staging folder. Nothing
 * becomes visible here: the Python driver appends the staged objects and commits them in
 * one txlog transaction after the job returns, exactly as for {@code format("txlog")}.
 * The input columns are, in order: key and value (string or binary), timestamp when the
 * rows have one, and optionally partition (an int or a long). Options ({@code txlog.*}): topic, partitions, staging (the
 * staging id), prefixUrl and prefixKey (the staging folder as a Hadoop URL and as a store
 * key), partitioner (default, murmur2 or roundrobin), fileBytes.
 */
public final class StagedWriteProvider implements TableProvider {
    /** The most bytes of a row group of a staged object (as txlog's Python writers cap them:
     * model.ROW_GROUP_BYTES). */
    static final long ROW_GROUP_BYTES = SliceReader.WHOLE_MAX;

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return new StructType();
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> props) {
        return new StagingTable();
    }

    static final class StagingTable implements Table, SupportsWrite {
        @Override
        public String name() {
            return "txlog staged write";
        }

        @Override
        @SuppressWarnings("deprecation")  // Spark 4.3 still asks for it
        public StructType schema() {
            return new StructType();
        }

        @Override
        public Set<TableCapability> capabilities() {
            return EnumSet.of(TableCapability.BATCH_WRITE, TableCapability.ACCEPT_ANY_SCHEMA);
        }

        @Override
        public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
            Spec spec = Spec.of(info.options(), info.schema());
            return new WriteBuilder() {
                @Override
                public Write build() {
                    return new Write() {
                        @Override
                        public BatchWrite toBatch() {
                            return new StagedBatchWrite(spec);
                        }
                    };
                }
            };
        }
    }

    /** The write, as every task sees it. */
    static final class Spec implements Serializable {
        private static final long serialVersionUID = 1L;

        final String topic;
        final int partitions;
        final String staging;
        final String prefixUrl;
        final String prefixKey;
        final boolean keyed;
        /** Index of the partition column (always last), or -1. */
        final int partitionColumn;
        /** The partition column holds longs (else an integer type of at most 32 bits). */
        final boolean partitionLong;
        /** Index of the timestamp column, or -1 (the records then have none). */
        final int timestampColumn;
        final long fileBytes;
        /** A local store that syncs: files and their folder are synced before commit. */
        final boolean fsync;
        final boolean local;
        /** The stored columns as written: key and value as binary, whatever the input had. */
        final StructType data;
        /** Which stored columns arrive as strings (read as their UTF-8 bytes). */
        final boolean[] strings;
        /** Where each of the columns above is in the written rows (null: in that order). */
        final int[] ordinals;
        /** The byte width of the written rows' partition column. */
        final int partitionWidth;

        private Spec(Map<String, String> o, StructType input, int[] ordinals,
                     int partitionWidth) {
            this.ordinals = ordinals == null ? null : ordinals.clone();
            this.partitionWidth = partitionWidth;
            this.topic = PlannedScanProvider.required(o, "txlog.topic");
            this.partitions = Integer.parseInt(PlannedScanProvider.required(o, "txlog.partitions"));
            this.staging = PlannedScanProvider.required(o, "txlog.staging");
            this.prefixUrl = PlannedScanProvider.required(o, "txlog.prefixUrl");
            this.prefixKey = PlannedScanProvider.required(o, "txlog.prefixKey");
            this.keyed = !"roundrobin".equals(o.getOrDefault("txlog.partitioner", "default"));
            this.fileBytes = Long.parseLong(o.getOrDefault("txlog.fileBytes", "134217728"));
            this.local = "file".equals(new Path(prefixUrl).toUri().getScheme());
            this.fsync = local && Boolean.parseBoolean(o.getOrDefault("txlog.fsync", "true"));
            String[] names = input.fieldNames();
            int n = names.length;
            this.partitionColumn = n > 0 && "partition".equals(names[n - 1]) ? n - 1 : -1;
            int stored = partitionColumn >= 0 ? n - 1 : n;
            this.partitionLong = partitionColumn >= 0
                && input.fields()[partitionColumn].dataType() instanceof LongType;
            // key, value, then timestamp when the rows have one: a batch object without
            // headers and timestamp columns holds records with neither (the readers give
            // them the batch's append time).
            String[] allowed = {"key", "value", "timestamp"};
            int ts = -1;
            int next = 0;
            boolean ok = stored >= 2 && "key".equals(names[0]) && "value".equals(names[1]);
            for (int i = 0; ok && i < stored; i++) {
                while (next < allowed.length && !allowed[next].equals(names[i])) {
                    next++;
                }
                ok = next < allowed.length;
                next++;
                if ("timestamp".equals(names[i])) {
                    ts = i;
                }
            }
            if (!ok) {
                throw new IllegalArgumentException(
                    "txlog staged write: columns must be key, value[, timestamp]"
                        + "[, partition], not " + String.join(", ", names)
                        + "; spark_ext.write() projects them");
            }
            this.timestampColumn = ts;
            StructType d = new StructType();
            this.strings = new boolean[stored];
            for (int i = 0; i < stored; i++) {
                StructField f = input.fields()[i];
                // Every stored column optional, as txlog's own writers store them: a
                // required column (a non-null expression) would make objects of one
                // partition differ in type.
                strings[i] = i < 2 && f.dataType() instanceof StringType;
                d = d.add(f.name(), i < 2 ? DataTypes.BinaryType : f.dataType(), true);
            }
            this.data = d;
        }

        static Spec of(Map<String, String> options, StructType input) {
            return new Spec(options, input, null, 4);
        }

        /** A write whose rows hold the columns of {@code input} at {@code ordinals} (-1: a
         * column the rows lack, always null), the partition column {@code partitionWidth}
         * bytes wide. */
        static Spec mapped(Map<String, String> options, StructType input, int[] ordinals,
                           int partitionWidth) {
            return new Spec(options, input, ordinals, partitionWidth);
        }
    }

    static class StagedBatchWrite implements BatchWrite {
        final Spec spec;

        StagedBatchWrite(Spec spec) {
            this.spec = spec;
        }

        @Override
        public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
            return factory(spec);
        }

        @SuppressWarnings("unchecked")  // Scala's Map.updated, seen from Java
        static DataWriterFactory factory(Spec spec) {
            SparkContext sc = SparkContext.getOrCreate();
            try {
                Job job = Job.getInstance(new Configuration(sc.hadoopConfiguration()));
                scala.collection.immutable.Map<String, String> options =
                    scala.collection.immutable.Map$.MODULE$.<String, String>empty()
                        .updated("compression", "snappy");
                OutputWriterFactory files = new ParquetFileFormat().prepareWrite(
                    org.apache.spark.sql.classic.SparkSession.active(), job, options, spec.data);
                Configuration conf = job.getConfiguration();
                if (spec.local) {
                    // No .crc file beside each object (txlog's local store writes none), and
                    // no chmod process per object (LocalFiles).
                    conf.set("fs.file.impl", LocalFiles.class.getName());
                    conf.setBoolean("fs.file.impl.disable.cache", true);
                }
                // Kafka timestamps are milliseconds; txlog's readers read them as such.
                conf.set(SQLConf.PARQUET_OUTPUT_TIMESTAMP_TYPE().key(), "TIMESTAMP_MILLIS");
                // No dictionaries: Kafka keys and values rarely repeat within a partition,
                // and routing keys to partitions keeps each file's distinct keys under the
                // dictionary's limit, where parquet-mr then hashes every key.
                conf.setBoolean("parquet.enable.dictionary", false);
                // No column statistics and no CRC per page, as txlog's Python writer writes
                // none: no txlog reader looks at them, and they cost CPU on every row.
                conf.setBoolean("parquet.column.statistics.enabled", false);
                conf.setBoolean("parquet.page.write-checksum.enabled", false);
                // Row groups no larger than an object the scan reads whole: a reader holds a
                // row group's columns while it reads them (and the writer while it fills
                // one), so neither grows with the size of a staged object.
                conf.setLong("parquet.block.size", ROW_GROUP_BYTES);
                return new Factory(spec, files, SerializableConfiguration.broadcast(sc, conf));
            } catch (IOException e) {
                throw new IllegalStateException("txlog staged write: cannot set up the job: " + e,
                                                e);
            }
        }

        @Override
        public void commit(WriterCommitMessage[] messages) {
            StringBuilder out = new StringBuilder();
            for (WriterCommitMessage m : messages) {
                if (m != null) {
                    out.append(m);  // see StagedWriter.Staged.toString
                }
            }
            StagedWrites.put(spec.staging, out.toString());
        }

        @Override
        public void abort(WriterCommitMessage[] messages) {
            // Tasks deleted what they wrote; the Python driver sweeps the staging folder.
        }
    }

    static final class Factory implements DataWriterFactory {
        private static final long serialVersionUID = 1L;

        private final Spec spec;
        private final OutputWriterFactory files;
        private final Broadcast<SerializableConfiguration> conf;

        Factory(Spec spec, OutputWriterFactory files, Broadcast<SerializableConfiguration> conf) {
            this.spec = spec;
            this.files = files;
            this.conf = conf;
        }

        @Override
        public DataWriter<InternalRow> createWriter(int partitionId, long taskId) {
            return new StagedWriter(spec, files, conf.value().value(), partitionId, taskId);
        }
    }
}

package io.txlog.spark;

import java.io.Closeable;
import java.io.IOException;
import java.lang.reflect.Constructor;
import java.lang.reflect.Field;

import org.apache.hadoop.fs.Path;
import org.apache.parquet.ParquetReadOptions;
import org.apache.parquet.VersionParser;
import org.apache.parquet.hadoop.ParquetFileReader;
import org.apache.parquet.hadoop.metadata.BlockMetaData;
import org.apache.parquet.hadoop.metadata.ParquetMetadata;
import org.apache.parquet.io.InputFile;
import org.apache.spark.sql.execution.datasources.parquet.SpecificParquetRecordReaderBase;
import org.apache.spark.sql.execution.datasources.parquet.VectorizedParquetRecordReader;

/**
 * Spark's vectorized Parquet reader, carried on from one batch object to the next of the
 * same schema: the requested schema, its conversion and the column vectors are set up once
 * per input partition instead of once per object (most of the time a read of small objects
 * took). The reader decodes a row group at a time; the next object's row groups are handed
 * to it as if they were more row groups of the same file, once the current one is read to
 * its end.
 */
final class ReusedReader extends VectorizedParquetRecordReader {
    // Spark keeps the row-group source's type package-private: it is set by reflection,
    // and where that is not possible (another Spark) every object gets a reader of its own.
    private static final Field SOURCE;
    private static final Constructor<?> SOURCE_OF;

    static {
        Field f = null;
        Constructor<?> c = null;
        try {
            f = SpecificParquetRecordReaderBase.class.getDeclaredField("reader");
            f.setAccessible(true);
            c = Class.forName(SpecificParquetRecordReaderBase.class.getName()
                              + "$ParquetRowGroupReaderImpl")
                .getDeclaredConstructor(ParquetFileReader.class);
            c.setAccessible(true);
        } catch (ReflectiveOperationException | RuntimeException e) {
            f = null;
            c = null;
        }
        SOURCE = f;
        SOURCE_OF = c;
    }

    ReusedReader(int capacity) {
        super(false, capacity);
    }

    /** Whether objects can be handed on to a reader at all (false: one reader each). */
    static boolean supported() {
        return SOURCE != null && SOURCE_OF != null;
    }

    /**
     * Hands the reader the rows of another object, which it returns once the current
     * object's rows are all read; false (and nothing changed) where the object's schema is
     * not the one the reader was set up for.
     */
    boolean carryOn(Path path, InputFile in, ParquetMetadata footer, ParquetReadOptions options)
        throws IOException {
        if (!supported() || !footer.getFileMetaData().getSchema().equals(fileSchema)) {
            return false;
        }
        ParquetFileReader next = new ParquetFileReader(in, footer, options, in.newStream());
        try {
            next.setRequestedSchema(requestedSchema);
            Object source = SOURCE_OF.newInstance(next);
            Object old = SOURCE.get(this);
            SOURCE.set(this, source);
            if (old != null) {
                ((Closeable) old).close();
            }
        } catch (ReflectiveOperationException | RuntimeException e) {
            next.close();
            throw new IOException("cannot hand on " + path + " to the Parquet reader", e);
        }
        long rows = 0;
        for (BlockMetaData b : footer.getBlocks()) {
            rows += b.getRowCount();
        }
        file = path;
        totalRowCount += rows;
        writerVersion = parsedVersion(footer.getFileMetaData().getCreatedBy());
        return true;
    }

    private static VersionParser.ParsedVersion parsedVersion(String createdBy) {
        try {
            return VersionParser.parse(createdBy);
        } catch (VersionParser.VersionParseException | RuntimeException e) {
            return null;  // as Spark's reader leaves it for a writer it does not know
        }
    }
}

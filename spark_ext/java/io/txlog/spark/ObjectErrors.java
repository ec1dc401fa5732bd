package io.txlog.spark;

import java.io.FileNotFoundException;
import java.io.IOException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/** What the scan says of a batch object it cannot read (each error names the object and
 * what to do), and txlog's decoder's attempt at an object read whole, whose failures are
 * said the same way. */
final class ObjectErrors {
    private static final Logger LOG = LoggerFactory.getLogger(ObjectErrors.class);

    private ObjectErrors() {
    }

    static IOException unreadable(String object, Exception e) {
        return new IOException(
            "txlog: cannot read batch object " + object + " (" + e + "); it may be "
                + "corrupt, truncated or not of the topic's schema. Check it with `txlog check`.",
            e);
    }

    static IOException truncated(String object, long rows, long end) {
        return new IOException(
            "txlog: batch object " + object + " has " + rows
                + " rows, but its log entry says it has at least " + end
                + "; the object is truncated or was replaced. Check it with "
                + "`txlog check`, or read with format('txlog'), which reports the object.");
    }

    /** The error for an object that could not be read: its size if that differs from the
     * declared one (FileNotFoundException: gone), else its checksum if it was read whole
     * and fails it, else {@code e} as it is. */
    static IOException openFailure(String object, Path path, Configuration conf, long declared,
                                   ObjectBytes whole, Exception e) throws IOException {
        if (declared > 0) {
            long actual = path.getFileSystem(conf).getFileStatus(path).getLen();  // FNF: gone
            if (actual != declared) {
                return new IOException(
                    "txlog: cannot read batch object " + object + ": it is "
                        + actual + " bytes, but its log entry says " + declared + "; it is "
                        + "corrupt, truncated or was replaced. Check it with `txlog check`.",
                    e);
            }
        }
        if (e instanceof FileNotFoundException) {
            throw (FileNotFoundException) e;
        }
        if (whole != null) {
            whole.verify(object);  // a damaged object is named as such
        }
        return unreadable(object, e);
    }

    /** The object read whole decoded by txlog's decoder, or null where the decoder does not
     * handle it (Spark's Parquet reader then reads it, as every object before). An object
     * that fails its checksum, or whose stored sizes and counts do not hold, is an error. */
    static DirectObject decodeDirectly(String object, Path path, Configuration conf,
                                       long declared, ObjectBytes whole,
                                       org.apache.spark.sql.types.StructType stored,
                                       ReadBuffers buffers)
        throws IOException {
        try {
            whole.verify(object);
            return DirectObject.decode(whole.bytes(), whole.length(), stored, buffers);
        } catch (PageDecoder.Unsupported e) {
            LOG.debug("txlog: {} is read by Spark's Parquet reader: {}", path, e.getMessage());
            return null;
        } catch (IOException | CompactReader.Damaged | RuntimeException e) {
            // As Spark's reader's failures are said: another size first, then the checksum.
            IOException failure;
            try {
                failure = openFailure(object, path, conf, declared, whole, e);
            } catch (FileNotFoundException gone) {  // gone meanwhile
                throw gone;
            } catch (IOException checksum) {
                failure = checksum;
            }
            throw new DecodeFailure(failure);
        }
    }

    /** A failure of txlog's decoder, already said as the scan says it (not wrapped again). */
    static final class DecodeFailure extends IOException {
        private static final long serialVersionUID = 1L;

        DecodeFailure(IOException e) {
            super(e.getMessage(), e);
        }
    }
}

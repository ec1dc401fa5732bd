package io.txlog.spark;

import java.io.IOException;
import java.net.URI;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.security.UserGroupInformation;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Hadoop filesystem through which the scan reads batch objects whole.
 *
 * <p>On S3 (s3a) that is an S3A filesystem of txlog's own, one per bucket and set of S3A
 * settings per JVM, with S3A's classic input stream: the scan reads each object in one
 * GET of the length its log entry declares. hadoop-aws 3.5's default stream (the analytics
 * accelerator) looks an object up with a HEAD first unless it is given the object's etag,
 * which txlog's log does not hold, and sets up per-object state meant for large Parquet
 * files: twice the requests and most of the scan's CPU for txlog's small objects. The
 * filesystem Spark and the user's other reads share keeps its settings; {@link
 * #STREAM_TYPE} picks another stream type for txlog's own reads, or {@code shared} to read
 * through that shared filesystem. Other schemes use Hadoop's cached filesystem.
 */
final class ObjectFileSystems {
    private static final Logger LOG = LoggerFactory.getLogger(ObjectFileSystems.class);

    /** The S3A input stream type of txlog's whole-object reads ({@code shared}: the
     * filesystem the rest of the application uses, with its settings). */
    static final String STREAM_TYPE = "txlog.scan.s3a.stream.type";
    static final String DEFAULT_STREAM_TYPE = "classic";
    static final String SHARED = "shared";
    private static final String S3A_STREAM_TYPE = "input.stream.type";

    /** The most filesystems of txlog's own open in one JVM. */
    static final int MAX_OWN = 16;

    private static final Map<List<Object>, FileSystem> OWN = new ConcurrentHashMap<>();
    private static boolean capWarned;  // guarded by OWN

    private ObjectFileSystems() {
    }

    /** The filesystem to read {@code path}'s object whole through. */
    static FileSystem forWholeReads(Path path, Configuration conf) throws IOException {
        URI uri = path.toUri();
        String stream = conf.getTrimmed(STREAM_TYPE, DEFAULT_STREAM_TYPE);
        if (!"s3a".equalsIgnoreCase(uri.getScheme()) || uri.getAuthority() == null
            || stream.isEmpty() || SHARED.equalsIgnoreCase(stream)) {
            return path.getFileSystem(conf);
        }
        String bucket = uri.getAuthority();
        // Keyed by every S3A setting, so that changed credentials or endpoints get a
        // filesystem of their own instead of one opened with the old ones.
        Map<String, String> s3a = new TreeMap<>(conf.getPropsWithPrefix("fs.s3a."));
        List<Object> key = Arrays.asList(
            bucket, UserGroupInformation.getCurrentUser().getShortUserName(), stream, s3a);
        FileSystem fs = OWN.get(key);
        if (fs != null) {
            return fs;
        }
        synchronized (OWN) {
            fs = OWN.get(key);
            if (fs == null && OWN.size() >= MAX_OWN) {
                // Settings that change from read to read would otherwise open a filesystem
                // (its threads and connections) for each.
                if (!capWarned) {
                    capWarned = true;
                    LOG.warn("txlog: {} S3A filesystems of txlog's own are open in this JVM, "
                             + "one per bucket and set of S3A settings; further reads use "
                             + "Spark's shared S3A filesystem. Keep one set of S3A settings "
                             + "per bucket in an application", OWN.size());
                }
                return path.getFileSystem(conf);
            }
            if (fs == null) {
                Configuration own = new Configuration(conf);
                // Both: a per-bucket setting the user made would override the general one.
                own.set("fs.s3a." + S3A_STREAM_TYPE, stream);
                own.set("fs.s3a.bucket." + bucket + "." + S3A_STREAM_TYPE, stream);
                // Not Hadoop's cache, which would hand this instance to every other read of
                // the bucket; Hadoop still closes it when the JVM exits.
                fs = FileSystem.newInstance(URI.create("s3a://" + bucket + "/"), own);
                OWN.put(key, fs);
                if (OWN.size() > 1) {
                    LOG.info("txlog: {} S3A filesystems of txlog's own are open in this JVM "
                             + "(one per bucket and set of S3A settings)", OWN.size());
                }
            }
        }
        return fs;
    }

    /** Whether {@code fs} is one {@link #forWholeReads} opened for txlog alone. */
    static boolean isOwn(FileSystem fs) {
        return OWN.containsValue(fs);
    }

    /** Closes and forgets txlog's own filesystems (tests). */
    static void closeAll() throws IOException {
        synchronized (OWN) {
            IOException first = null;
            for (FileSystem fs : OWN.values()) {
                try {
                    fs.close();
                } catch (IOException e) {
                    first = Objects.requireNonNullElse(first, e);
                }
            }
            OWN.clear();
            capWarned = false;
            if (first != null) {
                throw first;
            }
        }
    }
}

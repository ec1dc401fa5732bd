package io.txlog.spark;

import java.io.IOException;
import java.net.URI;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;

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

    /** Whether whole-object reads on S3 may use {@link SignedGet} instead of S3A where
     * the settings allow (true by default; false: always S3A). */
    static final String SIGNED_GET = "txlog.scan.s3a.signed.get";
    private static final String CREDENTIAL_PATH = "hadoop.security.credential.provider.path";
    private static final String S3A_IMPL = "org.apache.hadoop.fs.s3a.S3AFileSystem";
    /** Encryption the store undoes itself on a GET: no headers, the same bytes. */
    private static final java.util.Set<String> PLAIN_ENCRYPTION =
        java.util.Set.of("", "NONE", "SSE-S3", "AES256", "SSE-KMS", "DSSE-KMS");
    private static final String SIMPLE_PROVIDER =
        "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider";

    // Empty: the settings need S3A (a concurrent map holds no nulls).
    private static final Map<List<Object>, java.util.Optional<SignedGet>> SIGNED =
        new ConcurrentHashMap<>();

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
            || shared(conf)) {
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

    /**
     * The client that reads {@code path}'s object whole with one signed GET in place of
     * S3A, or null where S3A must: not s3a, turned off ({@link #SIGNED_GET}, or the shared
     * filesystem asked for), or settings this client does not implement. It implements
     * static keys (no session token, no other credentials provider), an endpoint and a
     * region given (an endpoint without a path), and nothing that changes where a GET goes
     * or what its bytes mean (see {@link #needsS3a}: proxies, access points, SSE-C and
     * client-side encryption, signers, custom headers, other S3A clients); anything else
     * (instance credentials, AWS's default endpoint) keeps S3A.
     */
    static SignedGet signedGet(Path path, Configuration conf) throws IOException {
        URI uri = path.toUri();
        String bucket = uri.getAuthority();
        if (!"s3a".equalsIgnoreCase(uri.getScheme()) || bucket == null
            || !conf.getBoolean(SIGNED_GET, true) || shared(conf) || proxied()) {
            return null;
        }
        Map<String, String> s3a = new TreeMap<>(conf.getPropsWithPrefix("fs.s3a."));
        // The credential providers and the user decide which keys getPassword finds.
        List<Object> key = Arrays.asList(
            bucket, s3a, conf.getTrimmed(CREDENTIAL_PATH, ""),
            UserGroupInformation.getCurrentUser().getShortUserName());
        java.util.Optional<SignedGet> known = SIGNED.get(key);
        if (known != null) {
            return known.orElse(null);
        }
        java.util.Optional<SignedGet> get = java.util.Optional.ofNullable(signedGetFor(bucket, conf));
        synchronized (SIGNED) {
            if (SIGNED.size() >= MAX_OWN && !SIGNED.containsKey(key)) {
                return null;  // settings that change from read to read: S3A, not a client each
            }
            return SIGNED.computeIfAbsent(key, k -> get).orElse(null);
        }
    }

    /** Whether txlog's reads go through the filesystem the application shares (also
     * where the stream type is set but empty). */
    private static boolean shared(Configuration conf) {
        String stream = conf.getTrimmed(STREAM_TYPE, DEFAULT_STREAM_TYPE);
        return stream.isEmpty() || SHARED.equalsIgnoreCase(stream);
    }

    /** Whether this JVM or its environment names an HTTP proxy, which S3A's client may use
     * and the signed GET does not. */
    private static boolean proxied() {
        for (String p : new String[] {"http.proxyHost", "https.proxyHost"}) {
            String v = System.getProperty(p);
            if (v != null && !v.isBlank()) {
                return true;
            }
        }
        for (String e : new String[] {"HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"}) {
            String v = System.getenv(e);
            if (v != null && !v.isBlank()) {
                return true;
            }
        }
        return false;
    }

    /**
     * Whether a setting changes where S3A sends a GET, how it signs it or what the bytes
     * it gets mean, none of which the signed GET implements.
     */
    private static boolean needsS3a(Configuration conf, String bucket, String endpoint) {
        String encryption = (s3a(conf, bucket, "encryption.algorithm").isEmpty()
            ? s3a(conf, bucket, "server-side-encryption-algorithm")
            : s3a(conf, bucket, "encryption.algorithm")).toUpperCase(java.util.Locale.ROOT);
        String impl = conf.getTrimmed("fs.s3a.impl", "");
        return !s3a(conf, bucket, "proxy.host").isEmpty()
            || "true".equalsIgnoreCase(s3a(conf, bucket, "requester.pays.enabled"))
            || !PLAIN_ENCRYPTION.contains(encryption)
            || !s3a(conf, bucket, "signing-algorithm").isEmpty()
            || !s3a(conf, bucket, "s3.signing-algorithm").isEmpty()
            || !s3a(conf, bucket, "custom.signers").isEmpty()
            || !s3a(conf, bucket, "accesspoint.arn").isEmpty()
            || "true".equalsIgnoreCase(s3a(conf, bucket, "accesspoint.required"))
            || !s3a(conf, bucket, "delegation.token.binding").isEmpty()
            || !(impl.isEmpty() || impl.equals(S3A_IMPL))
            || !s3a(conf, bucket, "s3.client.factory.impl").isEmpty()
            || !s3a(conf, bucket, "client.s3.custom.headers").isEmpty()
            || "true".equalsIgnoreCase(s3a(conf, bucket, "endpoint.fips"))
            || hasPath(endpoint);
    }

    /** Whether an endpoint names a path (a gateway at https://gw/s3), which S3A and
     * the signed GET would address differently. */
    private static boolean hasPath(String endpoint) {
        int scheme = endpoint.indexOf("://");
        String rest = scheme < 0 ? endpoint : endpoint.substring(scheme + 3);
        int slash = rest.indexOf('/');
        return slash >= 0 && !rest.substring(slash).replace("/", "").isEmpty()
            || rest.contains("?") || rest.contains("#");
    }

    private static SignedGet signedGetFor(String bucket, Configuration conf) throws IOException {
        String endpoint = s3a(conf, bucket, "endpoint");
        String region = s3a(conf, bucket, "endpoint.region");
        String provider = s3a(conf, bucket, "aws.credentials.provider");
        String access = secret(conf, bucket, "access.key");
        String secret = secret(conf, bucket, "secret.key");
        boolean unsupported = needsS3a(conf, bucket, endpoint)
            || !secret(conf, bucket, "session.token").isEmpty();
        if (endpoint.isEmpty() || region.isEmpty() || access.isEmpty() || secret.isEmpty()
            || !(provider.isEmpty() || provider.equals(SIMPLE_PROVIDER)) || unsupported) {
            return null;
        }
        if (!endpoint.contains("://")) {
            boolean ssl = !"false".equalsIgnoreCase(s3a(conf, bucket, "connection.ssl.enabled"));
            endpoint = (ssl ? "https://" : "http://") + endpoint;
        }
        while (endpoint.endsWith("/")) {
            endpoint = endpoint.substring(0, endpoint.length() - 1);
        }
        boolean pathStyle = "true".equalsIgnoreCase(s3a(conf, bucket, "path.style.access"));
        return new SignedGet(endpoint, bucket, pathStyle, region, access, secret,
                             limits(conf, bucket));
    }

    /**
     * S3A's retry and timeout settings as the signed GET applies them: 1 +
     * {@code attempts.maximum} attempts (default 3 retries), connecting within
     * {@code connection.establish.timeout} (30 s), at most {@code connection.timeout}
     * (200 s) without a byte, and each GET done within {@code connection.request.timeout}
     * (60 s; 0 there means no limit in S3A, which here is 60 s too).
     */
    static SignedGet.Limits limits(Configuration conf, String bucket) {
        String own = "fs.s3a.bucket." + bucket + ".attempts.maximum";
        int retries = conf.getInt(
            conf.getTrimmed(own) != null ? own : "fs.s3a.attempts.maximum", 3);
        long connect = duration(conf, bucket, "connection.establish.timeout", 30_000,
                                TimeUnit.MILLISECONDS);
        long read = duration(conf, bucket, "connection.timeout", 200_000, TimeUnit.MILLISECONDS);
        long request = duration(conf, bucket, "connection.request.timeout", 60_000,
                                TimeUnit.MILLISECONDS);
        return new SignedGet.Limits(
            (int) Math.max(1, Math.min(100, 1L + Math.max(0, retries))),
            (int) Math.max(1, Math.min(Integer.MAX_VALUE, connect)),
            (int) Math.max(1, Math.min(Integer.MAX_VALUE, read)),
            request > 0 ? request : 60_000);
    }

    /** A duration S3A setting (such as 60s; milliseconds if bare). */
    private static long duration(Configuration conf, String bucket, String name, long dflt,
                                 TimeUnit unit) {
        String own = "fs.s3a.bucket." + bucket + "." + name;
        String key = conf.getTrimmed(own) != null ? own : "fs.s3a." + name;
        String v = conf.getTrimmed(key, "");
        if (v.isEmpty()) {
            return dflt;
        }
        try {
            return conf.getTimeDuration(key, dflt, unit);
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("txlog: the S3A setting " + key + "=" + v
                + " is not a number or a duration such as 60s; correct it", e);
        }
    }

    /** An S3A setting as S3A reads it: the bucket's own, else the general one ("" if none). */
    private static String s3a(Configuration conf, String bucket, String name) {
        String v = conf.getTrimmed("fs.s3a.bucket." + bucket + "." + name);
        if (v == null) {
            v = conf.getTrimmed("fs.s3a." + name, "");
        }
        return v;
    }

    /** A secret S3A setting, from the configuration or its credential providers. */
    private static String secret(Configuration conf, String bucket, String name)
        throws IOException {
        char[] v = conf.getPassword("fs.s3a.bucket." + bucket + "." + name);
        if (v == null) {
            v = conf.getPassword("fs.s3a." + name);
        }
        return v == null ? "" : new String(v).trim();
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
            SIGNED.clear();
            capWarned = false;
            if (first != null) {
                throw first;
            }
        }
    }
}

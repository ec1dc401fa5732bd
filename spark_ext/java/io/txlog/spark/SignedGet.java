package io.txlog.spark;

import java.io.EOFException;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.net.HttpURLConnection;
import java.net.SocketTimeoutException;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.AccessDeniedException;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.time.Duration;
import java.time.ZoneOffset;
import java.time.ZonedDateTime;
import java.time.format.DateTimeFormatter;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * Reads an S3 object's first bytes with one GET signed with AWS Signature Version 4 from
 * static credentials, through the JDK's blocking HTTP connection (which keeps connections
 * alive between requests).
 *
 * <p>The scan reads many small batch objects whole, and through S3A each GET costs about a
 * millisecond of the executor's CPU in the AWS SDK's request pipeline and S3A's per-stream
 * statistics, several times what the object's decoding costs. This client does only what
 * such a GET needs: a URL, four signed headers, the body; the JDK's asynchronous HTTP client
 * measured about twice this one's CPU per GET. {@link ObjectFileSystems#signedGet}
 * decides from the Hadoop configuration whether it can stand in for S3A (static keys, an
 * endpoint and a region; nothing S3A would add to a GET, such as SSE-C or a proxy).
 */
final class SignedGet {
    /** The SHA-256 of an empty payload, which a GET signs. */
    static final String EMPTY_SHA256 =
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    private static final DateTimeFormatter STAMP =
        DateTimeFormatter.ofPattern("yyyyMMdd'T'HHmmss'Z'");
    private static final Pattern CODE = Pattern.compile("<Code>([^<]{1,100})</Code>");
    private static final Pattern RANGE = Pattern.compile(
        "bytes (\\d{1,18})-(\\d{1,18})/(\\d{1,18}|\\*)");
    private static final AtomicLong REQUESTS = new AtomicLong();
    /** Closes the connections of GETs over their deadline (one daemon thread per JVM). */
    private static final ScheduledThreadPoolExecutor WATCHDOG = watchdog();

    /**
     * How often and how long a GET is tried: {@code attempts} in all, each connecting
     * within {@code connectMs}, waiting at most {@code readMs} for any byte, and done
     * within {@code requestMs} from start to last byte.
     */
    record Limits(int attempts, int connectMs, int readMs, long requestMs) {
        Limits {
            if (attempts < 1 || connectMs < 1 || readMs < 1 || requestMs < 1) {
                throw new IllegalArgumentException("txlog: GET limits must be positive: "
                    + attempts + " attempts, " + connectMs + "/" + readMs + "/" + requestMs
                    + " ms; check fs.s3a.attempts.maximum and the fs.s3a.connection timeouts");
            }
        }
    }

    private final String endpoint;   // scheme://host[:port], no trailing slash
    private final String bucket;
    private final boolean pathStyle;
    private final String region;
    private final String accessKey;
    private final byte[] secret;     // "AWS4" + secret key
    private final Limits limits;
    private volatile DayKey dayKey;

    SignedGet(String endpoint, String bucket, boolean pathStyle, String region,
              String accessKey, String secretKey, Duration timeout) {
        this(endpoint, bucket, pathStyle, region, accessKey, secretKey,
             new Limits(4, millis(timeout), millis(timeout), millis(timeout)));
    }

    SignedGet(String endpoint, String bucket, boolean pathStyle, String region,
              String accessKey, String secretKey, Limits limits) {
        this.endpoint = endpoint;
        this.bucket = bucket;
        this.pathStyle = pathStyle;
        this.region = region;
        this.accessKey = accessKey;
        this.secret = ("AWS4" + secretKey).getBytes(StandardCharsets.UTF_8);
        this.limits = limits;
    }

    private static int millis(Duration d) {
        return (int) Math.max(1, Math.min(Integer.MAX_VALUE, d.toMillis()));
    }

    private static ScheduledThreadPoolExecutor watchdog() {
        ScheduledThreadPoolExecutor w = new ScheduledThreadPoolExecutor(1, r -> {
            Thread t = new Thread(r, "txlog-get-deadline");
            t.setDaemon(true);
            return t;
        });
        w.setRemoveOnCancelPolicy(true);  // most GETs finish in time: drop their timers
        return w;
    }

    Limits limits() {
        return limits;
    }

    /** GET requests sent by every instance in this JVM (tests count them). */
    static long requests() {
        return REQUESTS.get();
    }

    /** The URI of {@code key} (decoded, without a leading slash) in the bucket. */
    URI uri(String key) {
        String host = pathStyle ? endpoint : endpoint.replaceFirst("://", "://" + bucket + ".");
        return URI.create(host + canonicalPath(key));
    }

    private String canonicalPath(String key) {
        return (pathStyle ? "/" + encode(bucket) : "") + "/" + encode(key);
    }

    /**
     * The first {@code length} bytes of {@code key}. A missing object (HTTP 404 NoSuchKey,
     * or a 404 without an S3 error) raises FileNotFoundException, a shorter one
     * EOFException, refused credentials AccessDeniedException; any other 404 (such as
     * NoSuchBucket: a wrong bucket, endpoint or addressing) is an IOException naming the
     * code. Retried: server errors (5xx, 429), requests that fail to connect or to
     * answer, bodies cut short or broken while being read, and requests over the deadline.
     */
    byte[] read(String key, int length) throws IOException {
        URI uri = uri(key);
        IOException last = null;
        for (int attempt = 0; attempt < limits.attempts(); attempt++) {
            if (attempt > 0) {
                backoff(attempt);
            }
            if (Thread.currentThread().isInterrupted()) {
                throw new InterruptedIOException("txlog: interrupted before reading " + uri);
            }
            try {
                return once(uri, key, length);
            } catch (Retry r) {
                last = r.cause;  // a GET is safe to repeat; each attempt reads a fresh array
            }
        }
        if (last instanceof EOFException) {
            throw new EOFException(last.getMessage() + " (in each of " + limits.attempts()
                                   + " attempts)");
        }
        throw new IOException("txlog: GET s3a://" + bucket + "/" + key + " from " + endpoint
                              + " failed " + limits.attempts() + " times; the last error: "
                              + last, last);
    }

    /** One GET, abandoned (its connection closed) once it takes longer than the deadline,
     * so that a server sending a byte now and then cannot hold the task. */
    private byte[] once(URI uri, String key, int length) throws IOException {
        HttpURLConnection c = request(uri, key, length, ZonedDateTime.now(ZoneOffset.UTC));
        REQUESTS.incrementAndGet();
        AtomicBoolean expired = new AtomicBoolean();
        // Repeated until the GET ends: a disconnect while the connection is still being
        // made has nothing to close yet.
        ScheduledFuture<?> watchdog = WATCHDOG.scheduleWithFixedDelay(() -> {
            expired.set(true);
            c.disconnect();
        }, limits.requestMs(), Math.min(1000, limits.requestMs()), TimeUnit.MILLISECONDS);
        try {
            return exchange(c, key, length);
        } catch (IOException | RuntimeException e) {
            if (expired.get()) {
                // Whatever the connection, closed under it, threw.
                SocketTimeoutException late = new SocketTimeoutException(
                    "txlog: GET s3a://" + bucket + "/" + key + " from " + endpoint + " took "
                    + "longer than " + limits.requestMs() + " ms (fs.s3a.connection.request"
                    + ".timeout) and was abandoned");
                late.initCause(e);
                throw new Retry(late);
            }
            if (e instanceof Retry) {
                c.disconnect();  // a broken connection is not kept alive for the next GET
            }
            throw e;
        } finally {
            watchdog.cancel(false);
        }
    }

    private byte[] exchange(HttpURLConnection c, String key, int length) throws IOException {
        int status;
        try {
            status = c.getResponseCode();
        } catch (IOException e) {
            throw new Retry(e);
        }
        String what = "txlog: GET s3a://" + bucket + "/" + key + " from " + endpoint
            + " answered HTTP " + status;
        if (status == 200 || status == 206) {
            // The object's length where the answer says it, else -1.
            long size = status == 206 ? checkRange(c, what, length) : c.getContentLengthLong();
            byte[] data;
            try (InputStream body = c.getInputStream()) {
                data = body.readNBytes(length);
            } catch (IOException e) {
                throw new Retry(e);
            }
            if (data.length < length) {
                EOFException eof = new EOFException("txlog: s3a://" + bucket + "/" + key
                    + " ends at byte " + data.length + ", before byte " + length);
                if (size == data.length) {
                    throw eof;  // the object is that short
                }
                throw new Retry(eof);  // the body ended before the length it was sent with
            }
            return data;
        }
        String code;
        InputStream stream = c.getErrorStream();
        try (InputStream body = stream != null ? stream : InputStream.nullInputStream()) {
            code = errorCode(body);
        } catch (IOException e) {
            throw new Retry(e);
        }
        what += code.isEmpty() ? "" : " " + code;
        if (status == 404) {
            if (code.isEmpty() || "NoSuchKey".equals(code)) {
                throw new FileNotFoundException(what);
            }
            throw new IOException(what + ": the bucket or the request's address is wrong, "
                + "not the object missing; check the bucket name and the fs.s3a endpoint and "
                + "path.style.access settings (storage_options)");
        }
        if (status == 416) {
            throw new EOFException(what + " (the object is shorter than " + length + " bytes)");
        }
        if (status == 401 || status == 403) {
            throw new AccessDeniedException(c.getURL().toString(), null, what + denied(code));
        }
        if (status >= 500 || status == 429) {
            throw new Retry(new IOException(what));
        }
        throw new IOException(what);
    }

    /** What to do about a refusal with S3 error {@code code}. */
    private static String denied(String code) {
        if ("RequestTimeTooSkewed".equals(code)) {
            return ": this machine's clock differs from the store's by too much for a signed "
                + "request; check the clock (NTP) of this executor";
        }
        if (code.isEmpty() || "SignatureDoesNotMatch".equals(code)
            || "InvalidAccessKeyId".equals(code)) {
            return ": the store refused the credentials; check the key and secret in "
                + "storage_options (or the bucket's fs.s3a access.key and secret.key)";
        }
        return ": the store refused the request; check the credentials in storage_options "
            + "(or the bucket's fs.s3a access.key and secret.key) and what the bucket's "
            + "policy allows them";
    }

    /**
     * The object's length from a 206's Content-Range (-1 if the server does not say it),
     * after checking that the range starts at byte 0 and ends at {@code length - 1}, or
     * earlier only where the object ends there.
     */
    private static long checkRange(HttpURLConnection c, String what, int length)
        throws IOException {
        String header = c.getHeaderField("Content-Range");
        Matcher m = header == null ? null : RANGE.matcher(header.trim());
        if (m != null && m.matches()) {
            long first = Long.parseLong(m.group(1));
            long last = Long.parseLong(m.group(2));
            long size = "*".equals(m.group(3)) ? -1 : Long.parseLong(m.group(3));
            if (first == 0 && (last == length - 1 || (last < length - 1 && size == last + 1))) {
                return size;
            }
        }
        throw new IOException(what + " with Content-Range " + header + ", not bytes 0-"
            + (length - 1) + " as asked; a proxy or gateway between here and the store "
            + "changes ranged GETs: set txlog.scan.s3a.signed.get=false to read through S3A");
    }

    private void backoff(int attempt) throws InterruptedIOException {
        try {
            TimeUnit.MILLISECONDS.sleep(50L << Math.min(attempt, 5));  // 0.1 s to 1.6 s
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("txlog: interrupted between retries of a GET");
        }
    }

    private static String errorCode(InputStream body) throws IOException {
        String text = new String(body.readNBytes(4096), StandardCharsets.UTF_8);
        Matcher m = CODE.matcher(text);
        return m.find() ? m.group(1) : "";
    }

    /** An error after which the GET is sent again. */
    private static final class Retry extends IOException {
        private static final long serialVersionUID = 1L;
        final IOException cause;

        Retry(IOException cause) {
            super(cause);
            this.cause = cause;
        }
    }

    private HttpURLConnection request(URI uri, String key, int length, ZonedDateTime now)
        throws IOException {
        String range = "bytes=0-" + (length - 1);
        String stamp = STAMP.format(now);
        String auth = authorization(hostHeader(uri), canonicalPath(key), range, stamp);
        HttpURLConnection c = (HttpURLConnection) uri.toURL().openConnection();
        c.setInstanceFollowRedirects(false);
        c.setUseCaches(false);
        c.setConnectTimeout(limits.connectMs());
        c.setReadTimeout(limits.readMs());
        c.setRequestProperty("Range", range);
        c.setRequestProperty("x-amz-content-sha256", EMPTY_SHA256);
        c.setRequestProperty("x-amz-date", stamp);
        c.setRequestProperty("Authorization", auth);
        return c;
    }

    /** The Host header the JDK sends for {@code uri}, which the signature covers. */
    static String hostHeader(URI uri) {
        int port = uri.getPort();
        boolean https = "https".equalsIgnoreCase(uri.getScheme());
        boolean usual = port == -1 || (https && port == 443) || (!https && port == 80);
        return usual ? uri.getHost() : uri.getHost() + ":" + port;
    }

    /** The Authorization header of a GET of {@code path} (already URI-encoded) with a
     * Range header, signed at {@code stamp} (yyyyMMdd'T'HHmmss'Z'). */
    String authorization(String host, String path, String range, String stamp) {
        String signed = "host;range;x-amz-content-sha256;x-amz-date";
        String canonical = "GET\n" + path + "\n\n"
            + "host:" + host + "\n" + "range:" + range + "\n"
            + "x-amz-content-sha256:" + EMPTY_SHA256 + "\n" + "x-amz-date:" + stamp + "\n\n"
            + signed + "\n" + EMPTY_SHA256;
        String day = stamp.substring(0, 8);
        String scope = day + "/" + region + "/s3/aws4_request";
        String toSign = "AWS4-HMAC-SHA256\n" + stamp + "\n" + scope + "\n"
            + hex(sha256(canonical.getBytes(StandardCharsets.UTF_8)));
        String signature = hex(hmac(signingKey(day), toSign));
        return "AWS4-HMAC-SHA256 Credential=" + accessKey + "/" + scope + ", SignedHeaders="
            + signed + ", Signature=" + signature;
    }

    /** The key of a day's signatures (derived once a day, not per request). */
    private byte[] signingKey(String day) {
        DayKey cached = dayKey;
        if (cached != null && cached.day.equals(day)) {
            return cached.key;
        }
        byte[] k = hmac(secret, day);
        k = hmac(k, region);
        k = hmac(k, "s3");
        k = hmac(k, "aws4_request");
        dayKey = new DayKey(day, k);
        return k;
    }

    private static final class DayKey {
        final String day;
        final byte[] key;

        DayKey(String day, byte[] key) {
            this.day = day;
            this.key = key;
        }
    }

    /** {@code s} URI-encoded as S3 signs it: every byte but the unreserved characters and
     * '/' percent-encoded, in upper-case hex. */
    static String encode(String s) {
        byte[] bytes = s.getBytes(StandardCharsets.UTF_8);
        StringBuilder out = new StringBuilder(bytes.length + 16);
        for (byte b : bytes) {
            int c = b & 0xff;
            if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
                || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
                out.append((char) c);
            } else {
                out.append('%').append(Character.toUpperCase(Character.forDigit(c >> 4, 16)))
                    .append(Character.toUpperCase(Character.forDigit(c & 0xf, 16)));
            }
        }
        return out.toString();
    }

    private static byte[] sha256(byte[] data) {
        try {
            return MessageDigest.getInstance("SHA-256").digest(data);
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("this JVM has no SHA-256", e);
        }
    }

    private static byte[] hmac(byte[] key, String data) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(key, "HmacSHA256"));
            return mac.doFinal(data.getBytes(StandardCharsets.UTF_8));
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("this JVM has no HmacSHA256", e);
        }
    }

    private static String hex(byte[] bytes) {
        StringBuilder out = new StringBuilder(bytes.length * 2);
        for (byte b : bytes) {
            out.append(Character.forDigit((b >> 4) & 0xf, 16)).append(Character.forDigit(b & 0xf, 16));
        }
        return out.toString();
    }
}

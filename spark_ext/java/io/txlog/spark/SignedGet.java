package io.txlog.spark;

import java.io.EOFException;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.net.HttpURLConnection;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.AccessDeniedException;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.time.Duration;
import java.time.ZoneOffset;
import java.time.ZonedDateTime;
import java.time.format.DateTimeFormatter;
import java.util.concurrent.TimeUnit;
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
    private static final int ATTEMPTS = 4;
    private static final AtomicLong REQUESTS = new AtomicLong();

    private final String endpoint;   // scheme://host[:port], no trailing slash
    private final String bucket;
    private final boolean pathStyle;
    private final String region;
    private final String accessKey;
    private final byte[] secret;     // "AWS4" + secret key
    private final int timeoutMs;
    private volatile DayKey dayKey;

    SignedGet(String endpoint, String bucket, boolean pathStyle, String region,
              String accessKey, String secretKey, Duration timeout) {
        this.endpoint = endpoint;
        this.bucket = bucket;
        this.pathStyle = pathStyle;
        this.region = region;
        this.accessKey = accessKey;
        this.secret = ("AWS4" + secretKey).getBytes(StandardCharsets.UTF_8);
        this.timeoutMs = (int) Math.min(Integer.MAX_VALUE, timeout.toMillis());
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
     * The first {@code length} bytes of {@code key}. A missing object raises
     * FileNotFoundException, a shorter one EOFException, refused credentials
     * AccessDeniedException; server errors and broken connections are retried.
     */
    byte[] read(String key, int length) throws IOException {
        URI uri = uri(key);
        IOException last = null;
        for (int attempt = 0; attempt < ATTEMPTS; attempt++) {
            if (attempt > 0) {
                backoff(attempt);
            }
            if (Thread.currentThread().isInterrupted()) {
                throw new InterruptedIOException("txlog: interrupted before reading " + uri);
            }
            HttpURLConnection c;
            int status;
            try {
                c = request(uri, key, length, ZonedDateTime.now(ZoneOffset.UTC));
                REQUESTS.incrementAndGet();
                status = c.getResponseCode();
            } catch (IOException e) {
                last = e;  // a GET is safe to repeat
                continue;
            }
            InputStream stream = status < 400 ? c.getInputStream() : c.getErrorStream();
            try (InputStream body = stream != null ? stream : InputStream.nullInputStream()) {
                if (status == 200 || status == 206) {
                    byte[] data = body.readNBytes(length);
                    if (data.length < length) {
                        throw new EOFException("txlog: s3a://" + bucket + "/" + key + " ends at "
                                               + "byte " + data.length + ", before byte " + length);
                    }
                    return data;
                }
                String code = errorCode(body);
                String what = "txlog: GET s3a://" + bucket + "/" + key + " from " + endpoint
                    + " answered HTTP " + status + (code.isEmpty() ? "" : " " + code);
                if (status == 404) {
                    throw new FileNotFoundException(what);
                }
                if (status == 416) {
                    throw new EOFException(what + " (the object is shorter than " + length
                                           + " bytes)");
                }
                if (status == 401 || status == 403) {
                    throw new AccessDeniedException(uri.toString(), null, what + ": the store "
                        + "refused the credentials; check the key and secret in storage_options "
                        + "(or the bucket's fs.s3a access.key and secret.key)");
                }
                last = new IOException(what);
                if (status < 500 && status != 429) {
                    throw last;
                }
            }
        }
        throw new IOException("txlog: GET s3a://" + bucket + "/" + key + " from " + endpoint
                              + " failed " + ATTEMPTS + " times; the last error: " + last, last);
    }

    private static void backoff(int attempt) throws InterruptedIOException {
        try {
            TimeUnit.MILLISECONDS.sleep(50L << attempt);
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

    private HttpURLConnection request(URI uri, String key, int length, ZonedDateTime now)
        throws IOException {
        String range = "bytes=0-" + (length - 1);
        String stamp = STAMP.format(now);
        String auth = authorization(hostHeader(uri), canonicalPath(key), range, stamp);
        HttpURLConnection c = (HttpURLConnection) uri.toURL().openConnection();
        c.setInstanceFollowRedirects(false);
        c.setUseCaches(false);
        c.setConnectTimeout(timeoutMs);
        c.setReadTimeout(timeoutMs);
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

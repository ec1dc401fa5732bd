package io.txlog.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.EOFException;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.AccessDeniedException;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

class SignedGetTest {
    /** The S3 paths and Range headers of the GETs the server answered. */
    private final List<String> seen = new CopyOnWriteArrayList<>();
    private final Map<String, byte[]> objects = new ConcurrentHashMap<>();
    private final AtomicInteger failNext = new AtomicInteger();
    /** How the next requests are answered, one mode each (see answer); then normally. */
    private final java.util.Queue<String> modes =
        new java.util.concurrent.ConcurrentLinkedQueue<>();
    private HttpServer server;
    private String endpoint;

    @BeforeEach
    void start() throws IOException {
        server = HttpServer.create(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), 0);
        server.createContext("/", this::answer);
        server.setExecutor(java.util.concurrent.Executors.newCachedThreadPool());
        server.start();
        endpoint = "http://127.0.0.1:" + server.getAddress().getPort();
    }

    @AfterEach
    void stop() throws IOException {
        server.stop(0);
        ObjectFileSystems.closeAll();
    }

    /** A tiny S3: GET of /bucket/key with a Range bytes=0-N; 403 without a signature. */
    private void answer(HttpExchange ex) throws IOException {
        String path = ex.getRequestURI().getRawPath();
        String range = ex.getRequestHeaders().getFirst("Range");
        seen.add(path + " " + range);
        String auth = ex.getRequestHeaders().getFirst("Authorization");
        byte[] data = objects.get(ex.getRequestURI().getPath());
        String mode = modes.poll();
        if (mode != null && mode.startsWith("error ")) {
            // "error STATUS [CODE]": that status with that S3 error code, or no body.
            String[] f = mode.split(" ");
            byte[] err = f.length > 2
                ? ("<Error><Code>" + f[2] + "</Code></Error>").getBytes(StandardCharsets.UTF_8)
                : new byte[0];
            ex.sendResponseHeaders(Integer.parseInt(f[1]), err.length == 0 ? -1 : err.length);
            try (OutputStream out = ex.getResponseBody()) {
                out.write(err);
            }
            return;
        }
        if (mode != null && data != null) {
            int last = Integer.parseInt(range.substring("bytes=0-".length()));
            int n = Math.min(data.length, last + 1);
            answerOddly(ex, mode, data, n);
            return;
        }
        int status;
        byte[] body;
        if (failNext.getAndUpdate(n -> Math.max(0, n - 1)) > 0) {
            status = 503;
            body = "<Error><Code>SlowDown</Code></Error>".getBytes(StandardCharsets.UTF_8);
        } else if (auth == null || !auth.startsWith("AWS4-HMAC-SHA256 Credential=AK/")) {
            status = 403;
            body = "<Error><Code>AccessDenied</Code></Error>".getBytes(StandardCharsets.UTF_8);
        } else if (data == null) {
            status = 404;
            body = "<Error><Code>NoSuchKey</Code></Error>".getBytes(StandardCharsets.UTF_8);
        } else {
            int last = Integer.parseInt(range.substring("bytes=0-".length()));
            int n = Math.min(data.length, last + 1);
            status = 206;
            body = java.util.Arrays.copyOf(data, n);
            ex.getResponseHeaders().set("Content-Range", "bytes 0-" + (n - 1) + "/" + data.length);
        }
        ex.sendResponseHeaders(status, body.length);
        try (OutputStream out = ex.getResponseBody()) {
            out.write(body);
        }
    }

    /**
     * "whole": 200 with the whole object (a server ignoring Range); "range R": 206 with
     * Content-Range R; "cut": 206 announcing n bytes, sending half, closing the connection;
     * "trickle": 206 sending a byte every 20 ms.
     */
    private void answerOddly(HttpExchange ex, String mode, byte[] data, int n) throws IOException {
        if (mode.equals("whole")) {
            ex.sendResponseHeaders(200, data.length);
            try (OutputStream out = ex.getResponseBody()) {
                out.write(data);
            }
            return;
        }
        if (mode.startsWith("range")) {
            if (mode.length() > "range ".length()) {
                ex.getResponseHeaders().set("Content-Range", mode.substring("range ".length()));
            }
            ex.sendResponseHeaders(206, n);
            try (OutputStream out = ex.getResponseBody()) {
                out.write(data, 0, n);
            }
            return;
        }
        ex.getResponseHeaders().set("Content-Range", "bytes 0-" + (n - 1) + "/" + data.length);
        ex.sendResponseHeaders(206, n);
        OutputStream out = ex.getResponseBody();
        try {
            if (mode.equals("cut")) {
                out.write(data, 0, n / 2);
                out.flush();
            } else {
                for (int i = 0; i < n; i++) {
                    out.write(data[i]);
                    out.flush();
                    Thread.sleep(20);  // the trickling server's pace, not synchronisation
                }
            }
        } catch (IOException | InterruptedException gone) {
            // the client hung up
        } finally {
            ex.close();  // the connection closes short of the announced length
        }
    }

    private SignedGet client(String access) {
        return new SignedGet(endpoint, "b", true, "us-east-1", access, "S", Duration.ofSeconds(10));
    }

    @Test
    void signsAsTheS3DocumentationsExample() {
        // The worked example of a signed GET in Amazon S3's Signature Version 4 reference.
        SignedGet get = new SignedGet("https://s3.amazonaws.com", "examplebucket", false,
                                      "us-east-1", "AKIAIOSFODNN7EXAMPLE",
                                      "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                                      Duration.ofSeconds(1));
        URI uri = get.uri("test.txt");
        assertEquals("https://examplebucket.s3.amazonaws.com/test.txt", uri.toString());
        assertEquals("examplebucket.s3.amazonaws.com", SignedGet.hostHeader(uri));
        assertEquals("AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
                     + "aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                     + "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
                     get.authorization(SignedGet.hostHeader(uri), "/test.txt", "bytes=0-9",
                                       "20130524T000000Z"));
        assertEquals("127.0.0.1:8333", SignedGet.hostHeader(URI.create("http://127.0.0.1:8333/b")));
        assertEquals("a/b%20c/%C3%A9%2B~", SignedGet.encode("a/b c/\u00e9+~"));
    }

    @Test
    void readsAnObjectWithOneRangedRequest() throws IOException {
        byte[] data = "0123456789abcdef".getBytes(StandardCharsets.UTF_8);
        objects.put("/b/lake/x y.parquet", data);
        long before = SignedGet.requests();
        assertArrayEquals(java.util.Arrays.copyOf(data, 10), client("AK").read("lake/x y.parquet", 10));
        assertEquals(List.of("/b/lake/x%20y.parquet bytes=0-9"), seen);
        assertEquals(1, SignedGet.requests() - before);
    }

    @Test
    void errorsSayWhatHappened() {
        objects.put("/b/short", new byte[5]);
        SignedGet get = client("AK");
        assertThrows(FileNotFoundException.class, () -> get.read("gone", 10));
        assertThrows(EOFException.class, () -> get.read("short", 10));
        AccessDeniedException denied =
            assertThrows(AccessDeniedException.class, () -> client("WRONG").read("short", 5));
        assertTrue(denied.getMessage().contains("403 AccessDenied"), denied.getMessage());
    }

    @Test
    void retriesServerErrors() throws IOException {
        objects.put("/b/k", new byte[] {1, 2, 3});
        failNext.set(2);
        assertArrayEquals(new byte[] {1, 2, 3}, client("AK").read("k", 3));
        assertEquals(3, seen.size());
        failNext.set(10);
        IOException e = assertThrows(IOException.class, () -> client("AK").read("k", 3));
        assertTrue(e.getMessage().contains("503 SlowDown"), e.getMessage());
    }

    @Test
    void onlyAMissingKeyIsGone() throws IOException {
        objects.put("/b/k", new byte[] {1, 2, 3});
        SignedGet get = client("AK");
        modes.add("error 404 NoSuchBucket");
        IOException wrong = assertThrows(IOException.class, () -> get.read("k", 3));
        assertFalse(wrong instanceof FileNotFoundException, wrong.toString());
        assertTrue(wrong.getMessage().contains("404 NoSuchBucket"), wrong.getMessage());
        modes.add("error 404");
        assertThrows(FileNotFoundException.class, () -> get.read("k", 3));
        modes.add("error 404 NoSuchKey");
        assertThrows(FileNotFoundException.class, () -> get.read("k", 3));
    }

    @Test
    void refusalsNameTheS3ErrorAndWhatToCheck() throws IOException {
        objects.put("/b/k", new byte[] {1, 2, 3});
        SignedGet get = client("AK");
        modes.add("error 403 RequestTimeTooSkewed");
        AccessDeniedException skew =
            assertThrows(AccessDeniedException.class, () -> get.read("k", 3));
        assertTrue(skew.getMessage().contains("403 RequestTimeTooSkewed"), skew.getMessage());
        assertTrue(skew.getMessage().contains("check the clock"), skew.getMessage());
        modes.add("error 403 SignatureDoesNotMatch");
        AccessDeniedException sig =
            assertThrows(AccessDeniedException.class, () -> get.read("k", 3));
        assertTrue(sig.getMessage().contains("403 SignatureDoesNotMatch"), sig.getMessage());
        assertTrue(sig.getMessage().contains("secret"), sig.getMessage());
    }

    @Test
    void aPartialAnswerMustBeTheRangeAsked() throws IOException {
        byte[] data = "0123456789".getBytes(StandardCharsets.UTF_8);
        objects.put("/b/k", data);
        SignedGet get = client("AK");
        modes.add("range bytes 2-5/10");
        IOException shifted = assertThrows(IOException.class, () -> get.read("k", 4));
        assertTrue(shifted.getMessage().contains("Content-Range bytes 2-5/10"),
                   shifted.getMessage());
        modes.add("range");  // no Content-Range at all
        assertThrows(IOException.class, () -> get.read("k", 4));
        modes.add("range bytes 0-3/*");
        assertArrayEquals(java.util.Arrays.copyOf(data, 4), get.read("k", 4));
        // A server that ignores Range and sends the whole object: its first bytes.
        modes.add("whole");
        assertArrayEquals(java.util.Arrays.copyOf(data, 4), get.read("k", 4));
        modes.add("whole");
        assertThrows(EOFException.class, () -> get.read("k", 11));
    }

    @Test
    void aBodyCutShortIsReadAgain() throws IOException {
        byte[] data = new byte[4096];
        new java.util.Random(32).nextBytes(data);
        objects.put("/b/k", data);
        modes.add("cut");
        modes.add("cut");
        assertArrayEquals(data, client("AK").read("k", data.length));
        assertEquals(3, seen.size());
        // Cut every time: a short object after the retries, as through S3A.
        for (int i = 0; i < 4; i++) {
            modes.add("cut");
        }
        assertThrows(EOFException.class, () -> client("AK").read("k", data.length));
    }

    @Test
    void aTricklingServerIsAbandonedAtTheDeadline() {
        objects.put("/b/k", new byte[500]);  // 10 s at the server's pace
        for (int i = 0; i < 2; i++) {
            modes.add("trickle");
        }
        SignedGet get = new SignedGet(endpoint, "b", true, "us-east-1", "AK", "S",
                                      new SignedGet.Limits(2, 5_000, 5_000, 300));
        IOException e = assertThrows(IOException.class, () -> get.read("k", 500));
        assertTrue(e.getMessage().contains("longer than 300 ms"), e.getMessage());
        assertEquals(2, seen.size());
    }

    @Test
    void clientsAreKeptPerCredentialProvidersAndUser() throws IOException {
        Path p = new Path("s3a://b/lake/k");
        SignedGet first = ObjectFileSystems.signedGet(p, s3a());
        assertSame(first, ObjectFileSystems.signedGet(p, s3a()));
        // The same fs.s3a settings with another credential store may find other keys.
        assertNotSame(first, ObjectFileSystems.signedGet(p, s3a(
            "hadoop.security.credential.provider.path", "jceks://file/nonexistent/s.jceks")));
    }

    @Test
    void limitsFollowS3aSettings() {
        SignedGet.Limits d = ObjectFileSystems.limits(new Configuration(false), "b");
        assertEquals(new SignedGet.Limits(4, 30_000, 200_000, 60_000), d);
        Configuration conf = new Configuration(false);
        conf.set("fs.s3a.attempts.maximum", "5");
        conf.set("fs.s3a.bucket.b.attempts.maximum", "1");
        conf.set("fs.s3a.connection.establish.timeout", "5s");
        conf.set("fs.s3a.connection.timeout", "200000");
        conf.set("fs.s3a.connection.request.timeout", "2m");
        assertEquals(new SignedGet.Limits(2, 5_000, 200_000, 120_000),
                     ObjectFileSystems.limits(conf, "b"));
        conf.set("fs.s3a.connection.request.timeout", "0");
        assertEquals(60_000, ObjectFileSystems.limits(conf, "b").requestMs());
    }

    private static Configuration s3a(String... more) {
        Configuration conf = new Configuration(false);
        String b = "fs.s3a.bucket.b.";
        conf.set(b + "endpoint", "http://127.0.0.1:9");
        conf.set(b + "endpoint.region", "us-east-1");
        conf.set(b + "path.style.access", "true");
        conf.set(b + "access.key", "AK");
        conf.set(b + "secret.key", "S");
        conf.set(b + "aws.credentials.provider", "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider");
        for (int i = 0; i < more.length; i += 2) {
            conf.set(more[i], more[i + 1]);
        }
        return conf;
    }

    /** The signed GET for {@code conf}, not one cached for earlier settings (and not
     * beyond the cap on clients per JVM). */
    private static SignedGet signed(Path p, Configuration conf) throws IOException {
        ObjectFileSystems.closeAll();
        return ObjectFileSystems.signedGet(p, conf);
    }

    @Test
    void usedOnlyWhereItDoesWhatS3aWould() throws IOException {
        Path p = new Path("s3a://b/lake/k");
        assertNotNull(signed(p, s3a()));
        assertEquals("http://127.0.0.1:9/b/lake/k",
                     signed(p, s3a()).uri("lake/k").toString());
        assertNull(signed(new Path("file:///tmp/k"), s3a()));
        assertNull(signed(p, s3a(ObjectFileSystems.SIGNED_GET, "false")));
        assertNull(signed(p, s3a(ObjectFileSystems.STREAM_TYPE, "shared")));
        assertNull(signed(p, s3a("fs.s3a.bucket.b.session.token", "T")));
        assertNull(signed(p, s3a("fs.s3a.bucket.b.aws.credentials.provider",
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider")));
        assertNull(signed(p, s3a("fs.s3a.bucket.b.endpoint.region", "")));
        assertNull(signed(p, s3a("fs.s3a.proxy.host", "proxy")));
        assertNull(signed(p, s3a("fs.s3a.encryption.algorithm", "SSE-C")));
        assertNull(signed(p, s3a("fs.s3a.requester.pays.enabled", "true")));
        assertNull(signed(p, s3a(ObjectFileSystems.STREAM_TYPE, "")));
        String[][] s3aOnly = {
            {"fs.s3a.bucket.b.accesspoint.arn", "arn:aws:s3:us-east-1:1:accesspoint/ap"},
            {"fs.s3a.accesspoint.required", "true"},
            {"fs.s3a.delegation.token.binding",
             "org.apache.hadoop.fs.s3a.auth.delegation.SessionTokenBinding"},
            {"fs.s3a.encryption.algorithm", "CSE-KMS"},
            {"fs.s3a.bucket.b.server-side-encryption-algorithm", "SSE-C"},
            {"fs.s3a.impl", "com.example.OtherS3a"},
            {"fs.s3a.s3.client.factory.impl", "com.example.Factory"},
            {"fs.s3a.client.s3.custom.headers", "x-a=b"},
            {"fs.s3a.bucket.b.endpoint.fips", "true"},
            {"fs.s3a.bucket.b.endpoint", "http://127.0.0.1:9/s3"},
        };
        for (String[] kv : s3aOnly) {
            assertNull(signed(p, s3a(kv[0], kv[1])), kv[0] + "=" + kv[1]);
        }
        for (String plain : new String[] {"none", "SSE-S3", "AES256", "SSE-KMS", "DSSE-KMS"}) {
            assertNotNull(signed(p, s3a("fs.s3a.encryption.algorithm", plain)), plain);
        }
        assertNotNull(signed(p, s3a("fs.s3a.impl", "org.apache.hadoop.fs.s3a.S3AFileSystem")));
        assertNotNull(signed(p, s3a("fs.s3a.bucket.b.endpoint", "http://127.0.0.1:9/")));
        String proxy = System.getProperty("http.proxyHost");
        try {
            System.setProperty("http.proxyHost", "proxy.example");
            assertNull(signed(p, s3a()));
        } finally {
            if (proxy == null) {
                System.clearProperty("http.proxyHost");
            } else {
                System.setProperty("http.proxyHost", proxy);
            }
        }
        // Endpoints without a scheme take S3A's SSL setting; virtual-host addressing.
        SignedGet v = signed(p, s3a("fs.s3a.bucket.b.endpoint", "s3.example",
                                    "fs.s3a.bucket.b.path.style.access", "false"));
        assertEquals("https://b.s3.example/lake/k", v.uri("lake/k").toString());
    }
}

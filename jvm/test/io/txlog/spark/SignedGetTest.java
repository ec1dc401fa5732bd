package io.txlog.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
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
    private HttpServer server;
    private String endpoint;

    @BeforeEach
    void start() throws IOException {
        server = HttpServer.create(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), 0);
        server.createContext("/", this::answer);
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
        }
        ex.sendResponseHeaders(status, body.length);
        try (OutputStream out = ex.getResponseBody()) {
            out.write(body);
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

    @Test
    void usedOnlyWhereItDoesWhatS3aWould() throws IOException {
        Path p = new Path("s3a://b/lake/k");
        assertNotNull(ObjectFileSystems.signedGet(p, s3a()));
        assertEquals("http://127.0.0.1:9/b/lake/k",
                     ObjectFileSystems.signedGet(p, s3a()).uri("lake/k").toString());
        assertNull(ObjectFileSystems.signedGet(new Path("file:///tmp/k"), s3a()));
        assertNull(ObjectFileSystems.signedGet(p, s3a(ObjectFileSystems.SIGNED_GET, "false")));
        assertNull(ObjectFileSystems.signedGet(p, s3a(ObjectFileSystems.STREAM_TYPE, "shared")));
        assertNull(ObjectFileSystems.signedGet(p, s3a("fs.s3a.bucket.b.session.token", "T")));
        assertNull(ObjectFileSystems.signedGet(p, s3a("fs.s3a.bucket.b.aws.credentials.provider",
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider")));
        assertNull(ObjectFileSystems.signedGet(p, s3a("fs.s3a.bucket.b.endpoint.region", "")));
        assertNull(ObjectFileSystems.signedGet(p, s3a("fs.s3a.proxy.host", "proxy")));
        assertNull(ObjectFileSystems.signedGet(p, s3a("fs.s3a.encryption.algorithm", "SSE-C")));
        assertNull(ObjectFileSystems.signedGet(p, s3a("fs.s3a.requester.pays.enabled", "true")));
        // Endpoints without a scheme take S3A's SSL setting; virtual-host addressing.
        SignedGet v = ObjectFileSystems.signedGet(p, s3a("fs.s3a.bucket.b.endpoint", "s3.example",
                                                         "fs.s3a.bucket.b.path.style.access", "false"));
        assertEquals("https://b.s3.example/lake/k", v.uri("lake/k").toString());
    }
}

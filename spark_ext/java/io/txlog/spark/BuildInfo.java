package io.txlog.spark;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;

/** The build's identity: a digest of the sources it was built from, written into the jar
 * by its build (scripts/build-jar.sh, or spark_ext/jvm_scan.py's javac fallback), so that a
 * session holding an older txlog's jar is told apart from this one. */
public final class BuildInfo {
    static final String RESOURCE = "build-digest.txt";

    private BuildInfo() {
    }

    public static String digest() {
        try (InputStream in = BuildInfo.class.getResourceAsStream(RESOURCE)) {
            return in == null ? "unknown" : new String(in.readAllBytes(), StandardCharsets.UTF_8)
                .trim();
        } catch (IOException e) {
            return "unknown";
        }
    }
}

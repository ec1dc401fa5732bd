package io.txlog.spark;

import java.util.concurrent.ConcurrentHashMap;

/**
 * What each staged write's tasks reported, by staging id, for the Python driver to commit
 * (spark_ext/jvm_write.py takes it with {@link #take} once the Spark job has returned).
 */
public final class StagedWrites {
    private static final ConcurrentHashMap<String, String> DONE = new ConcurrentHashMap<>();

    private StagedWrites() {
    }

    static void put(String staging, String files) {
        DONE.put(staging, files);
    }

    /** The staged files of a finished write (one per line), or null; forgets them. */
    public static String take(String staging) {
        return DONE.remove(staging);
    }
}

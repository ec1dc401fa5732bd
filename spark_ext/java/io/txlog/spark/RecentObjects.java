package io.txlog.spark;

import java.lang.ref.SoftReference;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.LongSupplier;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;

/**
 * Batch objects of a remote store that this JVM read in the last seconds, kept in memory so
 * that the next query over the same rows (a count, then a write of the same DataFrame) does
 * not fetch them again: hadoop-aws's default input stream keeps the blocks it read for
 * Spark's Parquet reader the same way. Keeping them is safe because a batch object is never
 * rewritten: only objects whose key names a CRC-32 are kept, after their bytes matched it.
 *
 * <p>Entries are keyed by the client that read them (a {@link SignedGet} or a filesystem,
 * one per bucket and set of credentials), so a read with other credentials fetches the
 * object itself. An entry unused for {@link #IDLE_MS} is dropped; the least recently used
 * go first beyond {@link #BYTES}; and the bytes are softly held, so the garbage collector
 * takes them back before the JVM runs out of memory.
 */
final class RecentObjects {
    /** The most bytes kept (0: nothing is kept). Default: a quarter of the heap, at most
     * 2 GiB (hadoop-aws's stream keeps up to 2 GiB). */
    static final String BYTES = "txlog.scan.cache.bytes";
    /** Milliseconds an object is kept after its last read. */
    static final String IDLE_MS = "txlog.scan.cache.idle.ms";
    static final long DEFAULT_IDLE_MS = 5_000;
    /** The name of the thread that drops idle entries (one per JVM, a daemon). */
    static final String THREAD_NAME = "txlog-recent-objects";

    /** The one instance of this JVM. */
    static final RecentObjects SHARED = new RecentObjects(System::nanoTime);

    private record Key(Object client, String object) {
    }

    private static final class Entry {
        final SoftReference<byte[]> bytes;
        final int length;
        long used;  // nanoTime of the last read

        Entry(byte[] bytes, int length, long used) {
            this.bytes = new SoftReference<>(bytes);
            this.length = length;
            this.used = used;
        }
    }

    private final LongSupplier clock;
    private final LinkedHashMap<Key, Entry> entries = new LinkedHashMap<>(64, 0.75f, true);
    private final AtomicLong hits = new AtomicLong();
    private final AtomicLong kept = new AtomicLong();
    private long held;          // bytes of the entries, guarded by this
    private long idleNanos = TimeUnit.MILLISECONDS.toNanos(DEFAULT_IDLE_MS);
    private ScheduledThreadPoolExecutor cleaner;  // started with the first entry

    RecentObjects(LongSupplier clock) {
        this.clock = clock;
    }

    /** The most bytes {@code conf} lets this JVM keep. */
    static long capacity(Configuration conf) {
        long fallback = Math.min(2L << 30, Runtime.getRuntime().maxMemory() / 4);
        return Math.max(0, conf.getLong(BYTES, fallback));
    }

    /** Whether an object at {@code key} may be kept: its key names a checksum. */
    static boolean keepable(String key) {
        return ObjectBytes.expectedCrc(key) >= 0;
    }

    /** What reads {@code object} whole from {@code fsys} (with {@code signed}, where
     * given), as entries are keyed; null where the object is not kept: on local disk (the
     * OS caches files), a key naming no checksum, or no room. */
    static Object clientFor(FileSystem fsys, SignedGet signed, String object,
                            Configuration conf) {
        if (ReadMetrics.bypassed(fsys) || !keepable(object) || capacity(conf) <= 0) {
            return null;
        }
        return signed != null ? signed : fsys;
    }

    /** Keeps an object {@code client} read whole once its bytes matched their checksum;
     * not those that came from memory ({@code known}), nor an array of another length. */
    static void keep(Object client, String object, ObjectBytes whole, boolean known,
                     Configuration conf) {
        if (client != null && !known && whole.verified()
            && whole.length() == whole.bytes().length) {
            SHARED.put(client, object, whole.bytes(), whole.length(), conf);
        }
    }

    /** The bytes of {@code object} as {@code client} read them, if kept and of
     * {@code length} bytes; else null. */
    synchronized byte[] get(Object client, String object, int length, Configuration conf) {
        settle(conf);
        Entry e = entries.get(new Key(client, object));
        byte[] b = e == null ? null : e.bytes.get();
        if (b == null || e.length != length) {
            return null;
        }
        e.used = clock.getAsLong();
        hits.incrementAndGet();
        return b;
    }

    /** Whether {@code bytes} are the kept bytes of {@code object} (so already checked). */
    synchronized boolean holds(Object client, String object, byte[] bytes) {
        Entry e = entries.get(new Key(client, object));
        return e != null && e.bytes.get() == bytes;
    }

    /** Keeps the first {@code length} bytes of {@code bytes}, which matched the checksum
     * {@code object}'s key names and which nothing writes to again. */
    synchronized void put(Object client, String object, byte[] bytes, int length,
                          Configuration conf) {
        long cap = settle(conf);
        if (!keepable(object) || length > cap) {
            return;
        }
        Entry old = entries.put(new Key(client, object), new Entry(bytes, length,
                                                                    clock.getAsLong()));
        if (old != null) {
            held -= old.length;
        }
        held += length;
        kept.incrementAndGet();
        evict(cap, false);
        if (cleaner == null && this == SHARED) {
            cleaner = startCleaner();
        }
    }

    /** Objects read from memory so far (for tests and metrics). */
    long hits() {
        return hits.get();
    }

    /** Objects kept so far. */
    long kept() {
        return kept.get();
    }

    synchronized long heldBytes() {
        return held;
    }

    synchronized int size() {
        return entries.size();
    }

    /** Drops every entry. */
    synchronized void clear() {
        entries.clear();
        held = 0;
    }

    /** Applies {@code conf}'s limits and drops what they, idleness or the collector rule
     * out; returns the capacity. */
    private long settle(Configuration conf) {
        long cap = capacity(conf);
        long idle = conf.getLong(IDLE_MS, DEFAULT_IDLE_MS);
        idleNanos = TimeUnit.MILLISECONDS.toNanos(Math.max(0, idle));
        evict(cap, false);
        return cap;
    }

    /** Drops idle entries, then the least recently used beyond {@code cap} bytes; with
     * {@code all}, also those the collector cleared anywhere (else only up to the first
     * entry that stays: the ones after it were used later). */
    private void evict(long cap, boolean all) {
        long now = clock.getAsLong();
        Iterator<Map.Entry<Key, Entry>> it = entries.entrySet().iterator();
        while (it.hasNext()) {
            Entry e = it.next().getValue();
            boolean stale = now - e.used >= idleNanos || e.bytes.get() == null;
            if (stale || held > cap) {
                it.remove();
                held -= e.length;
            } else if (!all) {
                return;
            }
        }
    }

    /** Drops idle entries every second, so a JVM that stops scanning lets them go. */
    private ScheduledThreadPoolExecutor startCleaner() {
        ScheduledThreadPoolExecutor pool = new ScheduledThreadPoolExecutor(1, r -> {
            Thread t = new Thread(r, THREAD_NAME);
            t.setDaemon(true);
            return t;
        });
        pool.scheduleWithFixedDelay(() -> {
            synchronized (this) {
                evict(Long.MAX_VALUE, true);
            }
        }, 1, 1, TimeUnit.SECONDS);
        return pool;
    }
}

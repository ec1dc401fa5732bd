package io.txlog.spark;

import java.lang.ref.ReferenceQueue;
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

    /** An entry: its bytes softly held, and its key, to drop it once the collector took
     * them (its length then no longer counts). */
    private static final class Entry extends SoftReference<byte[]> {
        final Key key;
        final int length;
        long used;  // nanoTime of the last read

        Entry(Key key, byte[] bytes, int length, long used, ReferenceQueue<byte[]> cleared) {
            super(bytes, cleared);
            this.key = key;
            this.length = length;
            this.used = used;
        }
    }

    /** A setting of the scan's kept objects that is not what it must be. */
    static final class BadSetting extends IllegalArgumentException {
        private static final long serialVersionUID = 1L;

        BadSetting(String key, String value, String what) {
            super("txlog: spark.hadoop." + key + " is '" + value + "', not " + what
                  + ": correct or remove the setting.");
        }
    }

    private final LongSupplier clock;
    private final LinkedHashMap<Key, Entry> entries = new LinkedHashMap<>(64, 0.75f, true);
    private final ReferenceQueue<byte[]> cleared = new ReferenceQueue<>();
    private final AtomicLong hits = new AtomicLong();
    private final AtomicLong kept = new AtomicLong();
    private long held;          // bytes of the entries, guarded by this
    private long idleNanos = TimeUnit.MILLISECONDS.toNanos(DEFAULT_IDLE_MS);
    private ScheduledThreadPoolExecutor cleaner;  // started with the first entry

    RecentObjects(LongSupplier clock) {
        this.clock = clock;
    }

    /** The most bytes {@code conf} lets this JVM keep (a size: 536870912, 512m, 1g). */
    static long capacity(Configuration conf) {
        long fallback = Math.min(2L << 30, Runtime.getRuntime().maxMemory() / 4);
        try {
            return Math.max(0, conf.getLongBytes(BYTES, fallback));
        } catch (IllegalArgumentException e) {  // (a bad number or size suffix)
            throw new BadSetting(BYTES, conf.get(BYTES), "a size in bytes (536870912, 512m, 1g)");
        }
    }

    /** The milliseconds {@code conf} keeps an unread object. */
    static long idleMs(Configuration conf) {
        try {
            return Math.max(0, conf.getLong(IDLE_MS, DEFAULT_IDLE_MS));
        } catch (NumberFormatException e) {
            throw new BadSetting(IDLE_MS, conf.get(IDLE_MS), "a number of milliseconds");
        }
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
        Key k = new Key(client, object);
        Entry e = entries.get(k);
        byte[] b = e == null ? null : e.get();
        long now = clock.getAsLong();
        if (e != null && (b == null || now - e.used >= idleNanos)) {
            drop(e);  // (a lookup moved it to the end, where evict() would not look soon)
            return null;
        }
        if (b == null || e.length != length) {
            return null;
        }
        e.used = now;
        hits.incrementAndGet();
        return b;
    }

    /** Whether {@code bytes} are the kept bytes of {@code object} (so already checked). */
    synchronized boolean holds(Object client, String object, byte[] bytes) {
        Entry e = entries.get(new Key(client, object));
        return e != null && e.get() == bytes;
    }

    /** Keeps the first {@code length} bytes of {@code bytes}, which matched the checksum
     * {@code object}'s key names and which nothing writes to again. */
    synchronized void put(Object client, String object, byte[] bytes, int length,
                          Configuration conf) {
        long cap = settle(conf);
        if (!keepable(object) || length > cap) {
            return;
        }
        Key k = new Key(client, object);
        Entry old = entries.put(k, new Entry(k, bytes, length, clock.getAsLong(), cleared));
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
        idleNanos = TimeUnit.MILLISECONDS.toNanos(idleMs(conf));
        evict(cap, false);
        return cap;
    }

    /** Removes {@code e} if it is still the entry of its key. */
    private void drop(Entry e) {
        if (entries.remove(e.key, e)) {
            held -= e.length;
        }
    }

    /** Drops the entries whose bytes the collector took (as it queues them), then idle
     * entries, then the least recently used beyond {@code cap} bytes; with {@code all},
     * looks at every entry (else only up to the first that stays: the ones after it were
     * used later). */
    private void evict(long cap, boolean all) {
        for (java.lang.ref.Reference<? extends byte[]> r; (r = cleared.poll()) != null; ) {
            drop((Entry) r);
        }
        if (held > cap) {  // cleared ones not queued yet make no room for live ones to go
            for (Iterator<Entry> it = entries.values().iterator(); it.hasNext(); ) {
                Entry e = it.next();
                if (e.get() == null) {
                    it.remove();
                    held -= e.length;
                }
            }
        }
        long now = clock.getAsLong();
        Iterator<Map.Entry<Key, Entry>> it = entries.entrySet().iterator();
        while (it.hasNext()) {
            Entry e = it.next().getValue();
            if (now - e.used >= idleNanos || held > cap || e.get() == null) {
                it.remove();
                held -= e.length;
            } else if (!all) {
                return;
            }
        }
    }

    /** Drops idle entries every second while there are any, so a JVM that stops scanning
     * lets them go; it stops when none is left (a put starts it again). */
    private ScheduledThreadPoolExecutor startCleaner() {
        ScheduledThreadPoolExecutor pool = new ScheduledThreadPoolExecutor(1, r -> {
            Thread t = new Thread(r, THREAD_NAME);
            t.setDaemon(true);
            return t;
        });
        pool.scheduleWithFixedDelay(() -> {
            synchronized (this) {
                evict(Long.MAX_VALUE, true);
                if (entries.isEmpty() && cleaner == pool) {
                    cleaner = null;
                    pool.shutdown();
                }
            }
        }, 1, 1, TimeUnit.SECONDS);
        return pool;
    }
}

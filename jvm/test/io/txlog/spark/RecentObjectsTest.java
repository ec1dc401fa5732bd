package io.txlog.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.zip.CRC32;

import org.apache.hadoop.conf.Configuration;
import org.junit.jupiter.api.Test;

/** Objects a JVM read from a remote store, kept for the next read: by the client that read
 * them, for a while after their last read, within a byte bound, and only checked bytes. */
class RecentObjectsTest {
    private static final Object CLIENT = new Object();

    private final AtomicLong now = new AtomicLong(1_000_000_000L);
    private final RecentObjects recent = new RecentObjects(now::get);

    private static Configuration conf(long bytes, long idleMs) {
        Configuration c = new Configuration(false);
        c.setLong(RecentObjects.BYTES, bytes);
        c.setLong(RecentObjects.IDLE_MS, idleMs);
        return c;
    }

    private static String key(String name, byte[] data) {
        CRC32 crc = new CRC32();
        crc.update(data);
        return String.format("s3a://b/t/0/%s.crc32-%08x.parquet", name, crc.getValue());
    }

    private void advanceMs(long ms) {
        now.addAndGet(TimeUnit.MILLISECONDS.toNanos(ms));
    }

    @Test
    void aKeptObjectIsReadAgainFromMemoryByTheSameClientOnly() {
        Configuration c = conf(1 << 20, 5_000);
        byte[] data = {1, 2, 3, 4};
        String k = key("a", data);
        assertNull(recent.get(CLIENT, k, 4, c));
        recent.put(CLIENT, k, data, 4, c);
        assertSame(data, recent.get(CLIENT, k, 4, c));
        assertTrue(recent.holds(CLIENT, k, data));
        assertFalse(recent.holds(CLIENT, k, new byte[] {1, 2, 3, 4}));
        assertNull(recent.get(new Object(), k, 4, c));  // other credentials: fetched again
        assertNull(recent.get(CLIENT, k, 5, c));         // another declared size: not this
        assertEquals(1, recent.hits());
    }

    @Test
    void anObjectUnusedForTheIdleTimeIsDroppedAndAReadKeepsItLonger() {
        Configuration c = conf(1 << 20, 5_000);
        byte[] data = {9, 9};
        String k = key("b", data);
        recent.put(CLIENT, k, data, 2, c);
        advanceMs(4_000);
        assertSame(data, recent.get(CLIENT, k, 2, c));  // read: 5 s more from now
        advanceMs(4_000);
        assertSame(data, recent.get(CLIENT, k, 2, c));
        advanceMs(5_000);
        assertNull(recent.get(CLIENT, k, 2, c));
        assertEquals(0, recent.size());
        assertEquals(0, recent.heldBytes());
    }

    @Test
    void beyondTheBoundTheLeastRecentlyReadGoFirst() {
        Configuration c = conf(10, 60_000);
        byte[] a = new byte[4];
        byte[] b = new byte[4];
        byte[] d = new byte[4];
        a[0] = 1;
        b[0] = 2;
        d[0] = 3;
        recent.put(CLIENT, key("a", a), a, 4, c);
        recent.put(CLIENT, key("b", b), b, 4, c);
        advanceMs(1);
        assertSame(a, recent.get(CLIENT, key("a", a), 4, c));  // a: read after b
        recent.put(CLIENT, key("d", d), d, 4, c);               // 12 bytes > 10: b goes
        assertNull(recent.get(CLIENT, key("b", b), 4, c));
        assertSame(a, recent.get(CLIENT, key("a", a), 4, c));
        assertSame(d, recent.get(CLIENT, key("d", d), 4, c));
        assertEquals(8, recent.heldBytes());
        byte[] big = new byte[11];
        recent.put(CLIENT, key("big", big), big, 11, c);        // larger than the bound
        assertNull(recent.get(CLIENT, key("big", big), 11, c));
        assertEquals(8, recent.heldBytes());
    }

    @Test
    void nothingIsKeptWithoutRoomOrWithoutAChecksumInTheKey() {
        byte[] data = {5};
        recent.put(CLIENT, key("a", data), data, 1, conf(0, 5_000));
        assertEquals(0, recent.size());
        recent.put(CLIENT, "s3a://b/_staging/w/part-0.parquet", data, 1, conf(100, 5_000));
        assertEquals(0, recent.size());
        assertFalse(RecentObjects.keepable("s3a://b/_staging/w/part-0.parquet"));
        assertNull(RecentObjects.clientFor(null, null, key("a", data), conf(0, 5_000)));
    }

    @Test
    void theBoundIsASizeWithinTheHeapByDefaultAndAMalformedOneIsNamed() {
        long fallback = RecentObjects.capacity(new Configuration(false));
        assertTrue(fallback > 0 && fallback <= 2L << 30
                   && fallback <= Runtime.getRuntime().maxMemory() / 4, "" + fallback);
        Configuration c = new Configuration(false);
        c.set(RecentObjects.BYTES, "512m");
        assertEquals(512L << 20, RecentObjects.capacity(c));
        c.set(RecentObjects.BYTES, "lots");
        RecentObjects.BadSetting bad = assertThrows(RecentObjects.BadSetting.class,
                                                    () -> RecentObjects.capacity(c));
        assertTrue(bad.getMessage().contains("spark.hadoop.txlog.scan.cache.bytes is 'lots'"),
                   bad.getMessage());
    }

    @Test
    void onlyBytesThatMatchedTheirChecksumAreKept() throws IOException {
        Configuration c = conf(1 << 20, 5_000);
        byte[] data = {1, 2, 3};
        String k = key("c", data);
        ObjectBytes damaged = new ObjectBytes(new byte[] {1, 2, 4});
        assertThrows(IOException.class, () -> damaged.verify(k));
        try {
            RecentObjects.keep(CLIENT, k, damaged, false, c);  // (the shared instance)
            assertNull(RecentObjects.SHARED.get(CLIENT, k, 3, c));
            ObjectBytes unchecked = new ObjectBytes(data);
            RecentObjects.keep(CLIENT, k, unchecked, false, c);
            assertNull(RecentObjects.SHARED.get(CLIENT, k, 3, c));
            unchecked.verify(k);
            RecentObjects.keep(CLIENT, k, unchecked, false, c);
            assertSame(data, RecentObjects.SHARED.get(CLIENT, k, 3, c));
            assertTrue(ObjectBytes.checked(data, 3).verified());
        } finally {
            RecentObjects.SHARED.clear();
        }
    }
}

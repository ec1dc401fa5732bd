package io.txlog.spark;

import java.util.ArrayList;
import java.util.List;

/**
 * The arrays one task reads batch objects into and decompresses their pages into, kept from
 * one object to the next instead of allocated (and zeroed, then collected) for each: an
 * object read whole and its decompressed pages are each about the object's size, and a task
 * reads hundreds of them. What a batch returned to Spark refers to lives here until the
 * reader is asked for its next batch, as Spark's own vectorized reader reuses its vectors.
 */
final class ReadBuffers {
    /** Arrays of more bytes than this (together) are not kept: allocated for their use. */
    static final long KEEP_BYTES = 32L << 20;

    private byte[] object = new byte[0];
    private final List<byte[]> pages = new ArrayList<>();
    private int nextPage;
    private long pageBytes;

    /** An array of at least {@code n} bytes for an object read whole (its earlier content
     * is the previous object's). */
    byte[] object(int n) {
        if (n > KEEP_BYTES) {
            return new byte[n];
        }
        if (object.length < n) {
            object = new byte[grown(n)];
        }
        return object;
    }

    /** Every page array handed out since the last call may be handed out again: the row
     * group that referred to them is no longer read. */
    void releasePages() {
        nextPage = 0;
    }

    /** An array of at least {@code n} bytes for a decompressed page, not handed out since the
     * last {@link #releasePages}. */
    byte[] page(int n) {
        if (nextPage < pages.size()) {
            byte[] b = pages.get(nextPage);
            if (b.length >= n) {
                nextPage++;
                return b;
            }
            if (pageBytes - b.length + grown(n) <= KEEP_BYTES) {
                pageBytes += grown(n) - b.length;
                b = new byte[grown(n)];
                pages.set(nextPage++, b);
                return b;
            }
            return new byte[n];
        }
        if (pageBytes + grown(n) <= KEEP_BYTES) {
            byte[] b = new byte[grown(n)];
            pageBytes += b.length;
            pages.add(b);
            nextPage++;
            return b;
        }
        return new byte[n];
    }

    /** Room for slightly larger objects and pages than this one, as the next ones often are. */
    private static int grown(int n) {
        return (int) Math.min(Integer.MAX_VALUE - 8, n + (long) (n >> 4) + 64);
    }
}

package io.txlog.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/** The arrays a task reads objects and decompresses pages into: reused from one object (and
 * row group) to the next, never handed out twice while in use, and not kept beyond a bound. */
class ReadBuffersTest {
    @Test
    void pagesInUseAreDistinctAndReusedOnceReleased() {
        ReadBuffers b = new ReadBuffers();
        byte[] first = b.page(1000);
        byte[] second = b.page(10);
        assertNotSame(first, second);
        assertTrue(first.length >= 1000 && second.length >= 10);
        b.releasePages();
        assertSame(first, b.page(900));      // the same pages again, in the same order
        assertSame(second, b.page(10));
        byte[] third = b.page(5);
        assertNotSame(first, third);
        assertNotSame(second, third);
        b.releasePages();
        byte[] larger = b.page(5000);        // a larger page than the first: a larger array
        assertTrue(larger.length >= 5000);
        assertNotSame(first, larger);
        b.releasePages();
        assertSame(larger, b.page(5000));
    }

    @Test
    void objectsShareOneArrayThatGrows() {
        ReadBuffers b = new ReadBuffers();
        byte[] a = b.object(300);
        assertTrue(a.length >= 300);
        assertSame(a, b.object(200));
        byte[] c = b.object(100_000);
        assertTrue(c.length >= 100_000);
        assertSame(c, b.object(300));
    }

    @Test
    void arraysBeyondTheBoundAreNotKept() {
        ReadBuffers b = new ReadBuffers();
        int big = (int) ReadBuffers.KEEP_BYTES;
        byte[] kept = b.page(big / 2);
        byte[] notKept = b.page(big);         // would take the pages kept beyond the bound
        assertEquals(big, notKept.length);
        b.releasePages();
        assertSame(kept, b.page(big / 2));
        assertNotSame(notKept, b.page(big));
        assertNotSame(b.object(big + 1), b.object(big + 1));
    }
}

package io.txlog.spark;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.util.ArrayDeque;
import java.util.List;
import java.util.concurrent.CancellationException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.Future;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Reads the next objects of one input partition whole, on threads of its own, while the task
 * decodes the current one: on a remote store each object costs a request's round trip, and a
 * task that fetched them one after another would wait that long for every object.
 *
 * <p>At most {@code maxObjects} objects, and (beyond the first) at most {@code maxBytes} of
 * them, are fetched or held ahead of the task. An object's bytes, or the error its read
 * raised, are handed over by {@link #take} when the task reaches that object, so errors
 * surface on the object they belong to, in order. {@link #close} cancels what is left and
 * waits for the threads to end.
 */
final class ObjectPrefetch implements AutoCloseable {
    private static final Logger LOG = LoggerFactory.getLogger(ObjectPrefetch.class);
    private static final AtomicInteger PREFETCHERS = new AtomicInteger();

    /** The prefix of the name of every prefetch thread (tests look for leftovers by it). */
    static final String THREAD_PREFIX = "txlog-prefetch-";

    /** Reads one slice's object whole. */
    interface Fetch {
        byte[] read(int slice) throws IOException;
    }

    private static final class Ahead {
        final int slice;
        final long bytes;
        final Future<byte[]> result;

        Ahead(int slice, long bytes, Future<byte[]> result) {
            this.slice = slice;
            this.bytes = bytes;
            this.result = result;
        }
    }

    private final int[] slices;   // the slices to fetch, in the order the task reads them
    private final long[] sizes;   // bytes of each of those
    private final int maxObjects;
    private final long maxBytes;
    private final Fetch fetch;
    private final ThreadPoolExecutor pool;
    private final List<Thread> threads = new CopyOnWriteArrayList<>();
    private final ArrayDeque<Ahead> ahead = new ArrayDeque<>();
    private long aheadBytes;
    private int nextToFetch;      // index into slices

    ObjectPrefetch(int[] slices, long[] sizes, int maxObjects, long maxBytes, Fetch fetch) {
        this.slices = slices;
        this.sizes = sizes;
        this.maxObjects = Math.max(1, maxObjects);
        this.maxBytes = maxBytes;
        this.fetch = fetch;
        String name = THREAD_PREFIX + PREFETCHERS.incrementAndGet() + "-";
        AtomicInteger started = new AtomicInteger();
        // One thread per object in flight, started as needed; daemons, so a JVM never waits
        // for one, though close() does.
        this.pool = new ThreadPoolExecutor(
            this.maxObjects, this.maxObjects, 1, TimeUnit.SECONDS, new LinkedBlockingQueue<>(),
            r -> {
                Thread t = new Thread(r, name + started.incrementAndGet());
                t.setDaemon(true);
                threads.add(t);
                return t;
            });
    }

    /**
     * The bytes of {@code slice}'s object if it was fetched ahead, else null (the caller
     * reads it itself). Throws the error its read raised, as that read raised it. Objects
     * of slices before {@code slice} that the task did not take are dropped.
     */
    byte[] take(int slice) throws IOException {
        while (!ahead.isEmpty() && ahead.peekFirst().slice < slice) {
            drop(ahead.pollFirst());
        }
        fill(slice);
        if (ahead.isEmpty() || ahead.peekFirst().slice != slice) {
            return null;
        }
        Ahead a = ahead.pollFirst();
        aheadBytes -= a.bytes;
        fill(slice + 1);  // the freed room goes to the next object while this one decodes
        try {
            return a.result.get();
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            if (cause instanceof IOException) {
                throw (IOException) cause;
            }
            if (cause instanceof RuntimeException) {
                throw (RuntimeException) cause;
            }
            if (cause instanceof Error) {
                throw (Error) cause;
            }
            throw new IOException(cause);
        } catch (InterruptedException e) {
            a.result.cancel(true);
            Thread.currentThread().interrupt();
            InterruptedIOException stop = new InterruptedIOException(
                "txlog: interrupted while waiting for a batch object");
            stop.initCause(e);
            throw stop;
        } catch (CancellationException e) {
            throw new InterruptedIOException("txlog: the scan was closed while it read");
        }
    }

    /** Starts fetches of the slices from {@code from} on, as the window allows. */
    private void fill(int from) {
        while (nextToFetch < slices.length && slices[nextToFetch] < from) {
            nextToFetch++;
        }
        while (nextToFetch < slices.length && ahead.size() < maxObjects) {
            long bytes = sizes[nextToFetch];
            if (!ahead.isEmpty() && aheadBytes + bytes > maxBytes) {
                return;
            }
            int slice = slices[nextToFetch++];
            ahead.addLast(new Ahead(slice, bytes, pool.submit(() -> fetch.read(slice))));
            aheadBytes += bytes;
        }
    }

    private void drop(Ahead a) {
        a.result.cancel(true);
        aheadBytes -= a.bytes;
    }

    /** Cancels every fetch not taken and waits (a bounded time) for the threads to end
     * (a terminated pool's threads may still be finishing, so each is joined). */
    @Override
    public void close() {
        while (!ahead.isEmpty()) {
            drop(ahead.pollFirst());
        }
        nextToFetch = slices.length;
        pool.shutdownNow();
        boolean interrupted = Thread.interrupted();
        try {
            // A killed task's thread is interrupted: still wait, so no fetch outlives it.
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
            for (Thread t : threads) {
                while (t.isAlive() && System.nanoTime() < deadline) {
                    try {
                        TimeUnit.NANOSECONDS.timedJoin(t, deadline - System.nanoTime());
                    } catch (InterruptedException e) {
                        interrupted = true;
                    }
                }
            }
            if (threads.stream().anyMatch(Thread::isAlive)) {
                LOG.warn("txlog: a batch object prefetch did not stop within 30 s of the scan's "
                         + "end; its thread ends when the store answers.");
            }
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }
}

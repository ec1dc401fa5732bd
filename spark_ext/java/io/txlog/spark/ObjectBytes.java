package io.txlog.spark;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.zip.CRC32;

import org.apache.parquet.io.DelegatingSeekableInputStream;
import org.apache.parquet.io.InputFile;
import org.apache.parquet.io.SeekableInputStream;

/**
 * A batch object read whole into memory: one request for its footer and its columns, and
 * its bytes checked against the CRC-32 its key names, as the Python reader checks them.
 */
final class ObjectBytes implements InputFile {
    private static final Pattern TAG = Pattern.compile("\\.crc32-([0-9a-f]{8})\\.[a-z]+$");

    private final byte[] data;
    private final int length;
    private boolean verified;  // the bytes matched their key's checksum (or were kept so)

    ObjectBytes(byte[] data) {
        this(data, data.length);
    }

    /** The object held in the first {@code length} bytes of {@code data}. */
    ObjectBytes(byte[] data, int length) {
        if (length < 0 || length > data.length) {
            throw new IllegalArgumentException("an object of " + length + " bytes in an array of "
                                               + data.length);
        }
        this.data = data;
        this.length = length;
    }

    /** The checksum {@code key} names, or -1 for a key without one (older objects, and
     * those the JVM writer stages). */
    static long expectedCrc(String key) {
        Matcher m = TAG.matcher(key);
        return m.find() ? Long.parseLong(m.group(1), 16) : -1;
    }

    /** The same bytes, known to match their key's checksum (kept by {@link RecentObjects}
     * after they did): {@link #verify} does not compute it again. */
    static ObjectBytes checked(byte[] data, int length) {
        ObjectBytes b = new ObjectBytes(data, length);
        b.verified = true;
        return b;
    }

    /** Fails when the bytes do not match the checksum in {@code key}. */
    void verify(String key) throws IOException {
        long want = expectedCrc(key);
        if (want < 0 || verified) {
            return;
        }
        CRC32 crc = new CRC32();
        crc.update(data, 0, length);
        if (crc.getValue() != want) {
            throw new IOException(String.format(
                "txlog: batch object %s fails its checksum (CRC-32 %08x, its name says %08x): "
                    + "its bytes were damaged after it was written. Restore it from a backup; "
                    + "readers will not return its records.", key, crc.getValue(), want));
        }
        verified = true;
    }

    /** Whether {@link #verify} found the bytes to match a checksum their key names. */
    boolean verified() {
        return verified;
    }

    /** The array holding the object's bytes (not a copy): its first {@link #length} bytes. */
    byte[] bytes() {
        return data;
    }

    int length() {
        return length;
    }

    @Override
    public long getLength() {
        return length;
    }

    @Override
    public SeekableInputStream newStream() {
        Bytes in = new Bytes(data, length);
        return new DelegatingSeekableInputStream(in) {
            @Override
            public long getPos() {
                return in.position();
            }

            @Override
            public void seek(long newPos) throws IOException {
                if (newPos < 0 || newPos > length) {
                    throw new IOException("seek to " + newPos + " outside an object of "
                                          + length + " bytes");
                }
                in.moveTo((int) newPos);
            }
        };
    }

    /** A stream over the bytes that can be repositioned. */
    private static final class Bytes extends ByteArrayInputStream {
        Bytes(byte[] data, int length) {
            super(data, 0, length);
        }

        int position() {
            return pos;
        }

        void moveTo(int p) {
            pos = p;
        }
    }
}

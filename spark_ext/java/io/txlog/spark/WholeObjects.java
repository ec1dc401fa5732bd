package io.txlog.spark;

import java.io.EOFException;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.NoSuchFileException;
import java.nio.file.StandardOpenOption;

import org.apache.hadoop.fs.ChecksumFileSystem;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.util.functional.FutureIO;

/** Batch objects read whole, in one request: a signed GET, a local file read directly, or
 * the file system's whole-file read. */
final class WholeObjects {
    private WholeObjects() {
    }

    /** The object at {@code path}, of {@code status}'s length, read whole: with one signed
     * GET where {@code signed} is given, else through {@code fsys}. Shorter than that is an
     * EOFException, missing a FileNotFoundException. */
    static byte[] read(FileSystem fsys, SignedGet signed, Path path, FileStatus status)
        throws IOException {
        return read(fsys, signed, path, status, null);
    }

    /** The same, into the first bytes of {@code into} where it is given and a signed GET
     * does not read the object (a signed GET returns an array of its own). */
    static byte[] read(FileSystem fsys, SignedGet signed, Path path, FileStatus status,
                       byte[] into) throws IOException {
        int length = (int) status.getLen();
        if (signed != null) {
            return signed.read(path.toUri().getPath().substring(1), length);
        }
        byte[] data = into != null && into.length >= length ? into : new byte[length];
        if (fsys instanceof ChecksumFileSystem) {
            fsys = ((ChecksumFileSystem) fsys).getRawFileSystem();
        }
        // On local disk: read the file directly (Hadoop's local file system looks it up
        // first, and its checksummed variant looks for a .crc file beside it; txlog's
        // objects have none, their CRC-32 is in their key).
        if (fsys instanceof RawLocalFileSystem) {
            readLocal(localFile((RawLocalFileSystem) fsys, path), data, length);
            return data;
        }
        FSDataInputStream in = FutureIO.awaitFuture(
            fsys.openFile(path).withFileStatus(status)
                .opt("fs.option.openfile.read.policy", "whole-file").build());
        try {
            in.readFully(0, data, 0, length);
        } finally {
            in.close();
        }
        return data;
    }

    /** The local file of {@code path}: a file: URI's absolute path as it is (as txlog's
     * plans name objects), without the file system's per-call path checks; else as the
     * file system maps it (against its working directory, or another scheme's mapping). */
    static java.nio.file.Path localFile(RawLocalFileSystem fsys, Path path) {
        java.net.URI u = path.toUri();
        String p = u.getPath();
        String scheme = u.getScheme();
        if ((scheme == null || scheme.equals("file")) && "file".equals(fsys.getUri().getScheme())
            && p != null && p.startsWith("/")) {
            return java.nio.file.Paths.get(p);
        }
        return fsys.pathToFile(path).toPath();
    }

    private static void readLocal(java.nio.file.Path file, byte[] data, int length)
        throws IOException {
        try (FileChannel ch = FileChannel.open(file, StandardOpenOption.READ)) {
            ByteBuffer buf = ByteBuffer.wrap(data, 0, length);
            while (buf.hasRemaining()) {
                if (ch.read(buf, buf.position()) < 0) {
                    throw new EOFException(file + " ends at byte " + buf.position());
                }
            }
        } catch (NoSuchFileException e) {
            FileNotFoundException gone = new FileNotFoundException(file + " does not exist");
            gone.initCause(e);
            throw gone;
        }
    }
}

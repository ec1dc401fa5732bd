package io.txlog.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system, as the JVM writer stages objects on a local store: without
 * Hadoop's native library, {@link RawLocalFileSystem} sets the permissions of every file
 * and folder it creates by starting a {@code chmod} process. That was one process per
 * staged object: most of the difference between writing a topic of eight
 * partitions and one of a single partition. Here java.nio sets them, in this process.
 */
public final class LocalFiles extends RawLocalFileSystem {
    private static final PosixFilePermission[] BITS = {
        PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE,
        PosixFilePermission.OTHERS_READ, PosixFilePermission.GROUP_EXECUTE,
        PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
        PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE,
        PosixFilePermission.OWNER_READ,
    };

    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
        java.nio.file.Path file = pathToFile(p).toPath();
        // java.nio has no sticky bit, and clears a folder's setgid/setuid bits, which
        // chmod keeps (a group-shared folder's new files then keep its group): chmod there.
        if (permission.getStickyBit() || keepsSetId(file)) {
            super.setPermission(p, permission);
            return;
        }
        try {
            Files.setPosixFilePermissions(file, posix(permission.toShort()));
        } catch (UnsupportedOperationException e) {  // not a POSIX file system
            super.setPermission(p, permission);
        }
    }

    private static boolean keepsSetId(java.nio.file.Path file) throws IOException {
        if (!Files.isDirectory(file)) {
            return false;
        }
        try {
            Object mode = Files.getAttribute(file, "unix:mode");
            return mode instanceof Integer && ((Integer) mode & 06000) != 0;
        } catch (UnsupportedOperationException | IllegalArgumentException e) {
            return false;  // no unix attributes: nothing to keep
        }
    }

    static Set<PosixFilePermission> posix(int mode) {
        Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
        for (int i = 0; i < BITS.length; i++) {
            if ((mode & (1 << i)) != 0) {
                set.add(BITS[i]);
            }
        }
        return set;
    }
}

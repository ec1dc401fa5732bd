package io.txlog.spark;

import java.io.IOException;

import io.txlog.spark.CompactReader.Damaged;
import org.xerial.snappy.Snappy;

/**
 * Decodes one column chunk of a batch object held in memory: its page headers, its pages
 * (uncompressed or snappy), their RLE/bit-packed levels, and PLAIN or dictionary values of
 * a flat binary or 64-bit column, into arrays a column vector reads without copying the
 * values again. Every stored length, count and size is checked against the bytes it
 * describes and against the object's decoding budget; a shape it does not handle is
 * {@link Unsupported} (the caller reads the object another way).
 */
final class PageDecoder {
    // Parquet's enum values.
    static final int PLAIN = 0;
    static final int PLAIN_DICTIONARY = 2;
    static final int RLE = 3;
    static final int RLE_DICTIONARY = 8;
    static final int UNCOMPRESSED = 0;
    static final int SNAPPY = 1;
    private static final int DATA_PAGE = 0;
    private static final int INDEX_PAGE = 1;
    private static final int DICTIONARY_PAGE = 2;
    private static final int DATA_PAGE_V2 = 3;
    /** Snappy's largest expansion: a 3-byte copy element yields at most 64 bytes. */
    private static final long SNAPPY_MAX_RATIO = 22;

    /** A page, codec or encoding this decoder does not handle. */
    static final class Unsupported extends Exception {
        private static final long serialVersionUID = 1L;

        Unsupported(String message) {
            super(message);
        }
    }

    /** How many bytes decompression may still allocate for the object. */
    static final class Budget {
        long left;

        Budget(long left) {
            this.left = left;
        }

        void take(long n, String what) throws Damaged {
            if (n < 0 || n > left) {
                throw new Damaged(what + " would decode into more than the object's budget of "
                                  + "decoded bytes (" + n + " bytes asked)");
            }
            left -= n;
        }
    }

    /** A decoded flat column: per row its bytes' array, start and length (binary) or its
     * value (long), and whether it is null. */
    static final class Column {
        final int rows;
        final boolean[] nulls;
        int nullCount;
        final byte[][] base;
        final int[] start;
        final int[] length;
        final long[] longs;

        Column(int rows, boolean binary) {
            this.rows = rows;
            this.nulls = new boolean[rows];
            this.base = binary ? new byte[rows][] : null;
            this.start = binary ? new int[rows] : null;
            this.length = binary ? new int[rows] : null;
            this.longs = binary ? null : new long[rows];
        }
    }

    private final byte[] data;
    private final ObjectFooter.Chunk chunk;
    private final int maxDef;
    private final int maxRep;
    private final Budget budget;
    private final ReadBuffers buffers;  // null: each page decompressed into an array of its own

    // The current page header.
    private int pageType;
    private int uncompressedSize;
    private int compressedSize;
    private int numValues;
    private int encoding;
    private int defEncoding;
    private int repEncoding;
    private int defLength;
    private int repLength;
    private boolean compressedV2;

    // The dictionary: its entries' starts and lengths in dictBytes, or its longs.
    private byte[] dictBytes;
    private int[] dictStart;
    private int[] dictLength;
    private long[] dictLongs;
    private int dictSize = -1;

    PageDecoder(byte[] data, ObjectFooter.Chunk chunk, int maxDef, int maxRep, Budget budget,
                ReadBuffers buffers) {
        this.data = data;
        this.chunk = chunk;
        this.maxDef = maxDef;
        this.maxRep = maxRep;
        this.budget = budget;
        this.buffers = buffers;
    }

    /** The chunk as a column of {@code rows} rows (flat: one value or null per row). */
    Column flat(int rows, boolean binary) throws Damaged, Unsupported {
        if (maxRep != 0 || maxDef > 1) {
            throw new Unsupported("column " + chunk.path + " is not flat");
        }
        if (chunk.numValues != rows) {
            throw new Damaged("column " + chunk.path + " has " + chunk.numValues
                              + " values in a row group of " + rows + " rows");
        }
        Column out = new Column(rows, binary);
        int[] levels = new int[Math.min(rows, 1 << 16)];
        int row = 0;
        long p = ObjectFooter.chunkStart(chunk);
        long stop = p + chunk.compressed;
        while (row < rows) {
            int body = header(p, stop);
            p = body + (long) compressedSize;
            if (pageType == INDEX_PAGE) {
                continue;
            }
            if (pageType == DICTIONARY_PAGE) {
                dictionary(body, binary);
                continue;
            }
            if (numValues > rows - row) {
                throw new Damaged("a page of column " + chunk.path + " holds more values than "
                                  + "its row group has rows");
            }
            if (levels.length < numValues) {
                levels = new int[numValues];
            }
            byte[] page;
            int at;
            int end;
            if (pageType == DATA_PAGE) {
                page = body(body, compressedSize, uncompressedSize);
                at = page == data ? body : 0;
                end = at + uncompressedSize;
                if (maxDef > 0) {
                    checkLevelEncoding(defEncoding);
                    int n = le32Length(page, at, end);
                    rle(page, at + 4, at + 4 + n, 1, levels, numValues);
                    at += 4 + n;
                }
            } else {
                if (repLength != 0) {
                    throw new Damaged("a flat column " + chunk.path + " with repetition levels");
                }
                if (defLength < 0 || defLength > compressedSize) {
                    throw new Damaged("the levels of a page of " + chunk.path
                                      + " run past the page");
                }
                if (maxDef > 0) {
                    rle(data, body, body + defLength, 1, levels, numValues);
                }
                int rest = compressedSize - defLength;
                int restSize = uncompressedSize - defLength;
                if (compressedV2) {
                    page = body(body + defLength, rest, restSize);
                } else {
                    if (restSize != rest) {
                        throw new Damaged("an uncompressed page of " + chunk.path
                                          + " declares another size than it has");
                    }
                    page = data;
                }
                at = page == data ? body + defLength : 0;
                end = at + restSize;
            }
            if (maxDef == 0) {
                java.util.Arrays.fill(levels, 0, numValues, 1);
            }
            values(page, at, end, levels, out, row, binary);
            row += numValues;
        }
        return out;
    }

    /**
     * Walks the chunk's page headers for {@code rows} flat values without decoding a page:
     * Unsupported where a page is of a kind, codec or encoding {@link #flat} does not read,
     * so that the object goes to Spark's reader before any of its rows are returned.
     */
    void check(int rows) throws Damaged, Unsupported {
        if (maxRep != 0 || maxDef > 1) {
            throw new Unsupported("column " + chunk.path + " is not flat");
        }
        if (chunk.codec != UNCOMPRESSED && chunk.codec != SNAPPY) {
            throw new Unsupported("codec " + chunk.codec);
        }
        long seen = 0;
        long p = ObjectFooter.chunkStart(chunk);
        long stop = p + chunk.compressed;
        while (seen < rows) {
            int body = header(p, stop);  // each header takes a byte at least: p moves on
            p = body + (long) compressedSize;
            if (pageType == INDEX_PAGE) {
                continue;
            }
            if (pageType == DICTIONARY_PAGE) {
                if (encoding != PLAIN && encoding != PLAIN_DICTIONARY) {
                    throw new Unsupported("dictionary encoding " + encoding);
                }
                continue;
            }
            if (encoding != PLAIN && encoding != PLAIN_DICTIONARY && encoding != RLE_DICTIONARY) {
                throw new Unsupported("encoding " + encoding);
            }
            if (pageType == DATA_PAGE && maxDef > 0) {
                checkLevelEncoding(defEncoding);
            }
            seen += numValues;
        }
    }

    /** For the nested header column: true where every row's list is null (as txlog writes
     * records without headers), false where any row has a list. */
    boolean allNullLists(int rows) throws Damaged, Unsupported {
        if (chunk.numValues != rows) {
            return false;  // a list with several entries takes a value each
        }
        if (maxRep != 1) {
            throw new Unsupported("column " + chunk.path + " is not a list's");
        }
        int[] levels = new int[Math.min(rows, 1 << 16)];
        int[] reps = new int[levels.length];
        int seen = 0;
        long p = ObjectFooter.chunkStart(chunk);
        long stop = p + chunk.compressed;
        while (seen < rows) {
            int body = header(p, stop);
            p = body + (long) compressedSize;
            if (pageType == INDEX_PAGE || pageType == DICTIONARY_PAGE) {
                continue;
            }
            if (numValues > rows - seen) {
                throw new Damaged("a page of column " + chunk.path + " holds more values than "
                                  + "its row group has");
            }
            if (levels.length < numValues) {
                levels = new int[numValues];
                reps = new int[numValues];
            }
            int defWidth = 32 - Integer.numberOfLeadingZeros(maxDef);
            if (pageType == DATA_PAGE) {
                byte[] page = body(body, compressedSize, uncompressedSize);
                int at = page == data ? body : 0;
                int end = at + uncompressedSize;
                checkLevelEncoding(repEncoding);
                int r = le32Length(page, at, end);
                rle(page, at + 4, at + 4 + r, 1, reps, numValues);
                at += 4 + r;
                checkLevelEncoding(defEncoding);
                int n = le32Length(page, at, end);
                rle(page, at + 4, at + 4 + n, defWidth, levels, numValues);
            } else {
                if (repLength < 0 || defLength < 0 || (long) repLength + defLength > compressedSize) {
                    throw new Damaged("the levels of a page of " + chunk.path
                                      + " run past the page");
                }
                rle(data, body, body + repLength, 1, reps, numValues);
                rle(data, body + repLength, body + repLength + defLength, defWidth, levels,
                    numValues);
            }
            for (int i = 0; i < numValues; i++) {
                if (levels[i] != 0 || reps[i] != 0) {
                    return false;
                }
            }
            seen += numValues;
        }
        return true;
    }

    private static void checkLevelEncoding(int e) throws Unsupported {
        if (e != RLE) {
            throw new Unsupported("levels of encoding " + e);
        }
    }

    /** Reads the page header at {@code p}; returns where its body starts. */
    private int header(long p, long stop) throws Damaged, Unsupported {
        if (p >= stop) {
            throw new Damaged("column " + chunk.path + " ends before its values do");
        }
        CompactReader in = new CompactReader(data, (int) p, (int) stop);
        pageType = -1;
        uncompressedSize = -1;
        compressedSize = -1;
        numValues = -1;
        encoding = -1;
        defEncoding = RLE;
        repEncoding = RLE;
        defLength = -1;
        repLength = -1;
        compressedV2 = true;
        in.beginStruct();
        for (int h = in.fieldHeader(); h >= 0; h = in.fieldHeader()) {
            int t = CompactReader.type(h);
            int id = CompactReader.id(h);
            if (id == 1 && t == CompactReader.I32) {
                pageType = in.readI32();
            } else if (id == 2 && t == CompactReader.I32) {
                uncompressedSize = in.readI32();
            } else if (id == 3 && t == CompactReader.I32) {
                compressedSize = in.readI32();
            } else if ((id == 5 || id == 7 || id == 8) && t == CompactReader.STRUCT) {
                pageHeader(in, id);
            } else {
                in.skip(t);
            }
        }
        in.endStruct();
        int body = in.position();
        if (compressedSize < 0 || uncompressedSize < 0 || compressedSize > stop - body) {
            throw new Damaged("a page of column " + chunk.path + " runs past its column");
        }
        if (pageType == DATA_PAGE || pageType == DATA_PAGE_V2 || pageType == DICTIONARY_PAGE) {
            if (numValues < 0) {
                throw new Damaged("a page of column " + chunk.path + " has no value count");
            }
        } else if (pageType != INDEX_PAGE) {
            throw new Unsupported("page type " + pageType);
        }
        return body;
    }

    /** A data page's (5), dictionary page's (7) or data page v2's (8) own header. */
    private void pageHeader(CompactReader in, int kind) throws Damaged {
        in.beginStruct();
        for (int h = in.fieldHeader(); h >= 0; h = in.fieldHeader()) {
            int t = CompactReader.type(h);
            int id = CompactReader.id(h);
            boolean i32 = t == CompactReader.I32;
            if (id == 1 && i32) {
                numValues = in.readI32();
            } else if (kind == 5 && id == 2 && i32 || kind == 7 && id == 2 && i32
                       || kind == 8 && id == 4 && i32) {
                encoding = in.readI32();
            } else if (kind == 5 && id == 3 && i32) {
                defEncoding = in.readI32();
            } else if (kind == 5 && id == 4 && i32) {
                repEncoding = in.readI32();
            } else if (kind == 8 && id == 5 && i32) {
                defLength = in.readI32();
            } else if (kind == 8 && id == 6 && i32) {
                repLength = in.readI32();
            } else if (kind == 8 && id == 7
                       && (t == CompactReader.BOOL_TRUE || t == CompactReader.BOOL_FALSE)) {
                compressedV2 = in.readBool(t);
            } else {
                in.skip(t);
            }
        }
        in.endStruct();
    }

    /** A page's body of {@code size} stored bytes at {@code from}, decompressed to
     * {@code want} bytes: the object's own array where it is stored uncompressed, else the
     * first {@code want} bytes of the array returned. */
    private byte[] body(int from, int size, int want) throws Damaged, Unsupported {
        if (chunk.codec == UNCOMPRESSED) {
            if (want != size) {
                throw new Damaged("an uncompressed page of " + chunk.path
                                  + " declares another size than it has");
            }
            return data;
        }
        if (chunk.codec != SNAPPY) {
            throw new Unsupported("codec " + chunk.codec);
        }
        if (want > SNAPPY_MAX_RATIO * size + 64) {
            throw new Damaged("a snappy page of " + chunk.path + " declares " + want
                              + " bytes from " + size + ", more than snappy expands to");
        }
        budget.take(want, "column " + chunk.path);
        byte[] out = buffers != null ? buffers.page(want) : new byte[want];
        try {
            if (Snappy.uncompressedLength(data, from, size) != want
                || Snappy.uncompress(data, from, size, out, 0) != want) {
                throw new Damaged("a snappy page of " + chunk.path
                                  + " decompresses to another size than it declares");
            }
        } catch (IOException e) {
            throw new Damaged("a snappy page of " + chunk.path + " does not decompress: " + e);
        } catch (org.xerial.snappy.SnappyError e) {  // no native snappy here
            throw new Unsupported("snappy: " + e);
        }
        return out;
    }

    private void dictionary(int body, boolean binary) throws Damaged, Unsupported {
        if (dictSize >= 0) {
            throw new Damaged("column " + chunk.path + " has a second dictionary");
        }
        if (encoding != PLAIN && encoding != PLAIN_DICTIONARY) {
            throw new Unsupported("dictionary encoding " + encoding);
        }
        byte[] page = body(body, compressedSize, uncompressedSize);
        int at = page == data ? body : 0;
        int end = at + uncompressedSize;
        int n = numValues;
        if (binary) {
            if (n > (end - at) / 4) {
                throw new Damaged("a dictionary of " + chunk.path + " has more entries than bytes");
            }
            dictStart = new int[n];
            dictLength = new int[n];
            for (int i = 0; i < n; i++) {
                int len = le32Length(page, at, end);
                dictStart[i] = at + 4;
                dictLength[i] = len;
                at += 4 + len;
            }
            dictBytes = page;
        } else {
            if (n > (end - at) / 8) {
                throw new Damaged("a dictionary of " + chunk.path + " has more entries than bytes");
            }
            dictLongs = new long[n];
            for (int i = 0; i < n; i++, at += 8) {
                dictLongs[i] = le64(page, at);
            }
        }
        dictSize = n;
    }

    /** Values of the page's rows [row, row + numValues): levels say which are null. */
    private void values(byte[] page, int at, int end, int[] levels, Column out, int row,
                        boolean binary) throws Damaged, Unsupported {
        int n = numValues;
        if (encoding == PLAIN) {
            for (int i = 0; i < n; i++) {
                int r = row + i;
                if (levels[i] == 0) {
                    out.nulls[r] = true;
                    out.nullCount++;
                } else if (binary) {
                    int len = le32Length(page, at, end);
                    out.base[r] = page;
                    out.start[r] = at + 4;
                    out.length[r] = len;
                    at += 4 + len;
                } else {
                    if (end - at < 8) {
                        throw new Damaged("values of " + chunk.path + " run past their page");
                    }
                    out.longs[r] = le64(page, at);
                    at += 8;
                }
            }
            return;
        }
        if (encoding != PLAIN_DICTIONARY && encoding != RLE_DICTIONARY) {
            throw new Unsupported("encoding " + encoding);
        }
        if (dictSize < 0) {
            throw new Damaged("column " + chunk.path + " refers to a dictionary it has not");
        }
        int present = 0;
        for (int i = 0; i < n; i++) {
            present += levels[i] == 0 ? 0 : 1;
        }
        if (at >= end && present > 0) {
            throw new Damaged("values of " + chunk.path + " run past their page");
        }
        int[] ids = new int[present];
        if (present > 0) {
            int width = page[at] & 0xff;
            if (width > 32) {
                throw new Damaged("dictionary indices of " + width + " bits in " + chunk.path);
            }
            rle(page, at + 1, end, width, ids, present);
        }
        int k = 0;
        for (int i = 0; i < n; i++) {
            int r = row + i;
            if (levels[i] == 0) {
                out.nulls[r] = true;
                out.nullCount++;
                continue;
            }
            int id = ids[k++];
            if (id < 0 || id >= dictSize) {
                throw new Damaged("column " + chunk.path + " refers to dictionary entry " + id
                                  + " of " + dictSize);
            }
            if (binary) {
                out.base[r] = dictBytes;
                out.start[r] = dictStart[id];
                out.length[r] = dictLength[id];
            } else {
                out.longs[r] = dictLongs[id];
            }
        }
    }

    /** A 4-byte little-endian length at {@code at}, of bytes that must follow before end. */
    private int le32Length(byte[] b, int at, int end) throws Damaged {
        if (end - at < 4) {
            throw new Damaged("column " + chunk.path + " runs past its page");
        }
        int n = ObjectFooter.le32(b, at);
        if (n < 0 || n > end - at - 4) {
            throw new Damaged("a length of " + n + " bytes runs past its page in " + chunk.path);
        }
        return n;
    }

    private static long le64(byte[] b, int at) {
        return (ObjectFooter.le32(b, at) & 0xffffffffL) | ((long) ObjectFooter.le32(b, at + 4) << 32);
    }

    /** Parquet's RLE/bit-packed hybrid: {@code n} values of {@code width} bits into out. */
    private void rle(byte[] b, int at, int end, int width, int[] out, int n) throws Damaged {
        if (at < 0 || end > b.length || at > end) {
            throw new Damaged("levels of " + chunk.path + " run past their page");
        }
        int bytes = (width + 7) / 8;
        long mask = width == 32 ? 0xffffffffL : (1L << width) - 1;
        int i = 0;
        while (i < n) {
            long h = 0;
            int shift = 0;
            while (true) {
                if (at >= end || shift > 35) {
                    throw new Damaged("a run of " + chunk.path + " runs past its page");
                }
                byte x = b[at++];
                h |= (long) (x & 0x7f) << shift;
                shift += 7;
                if (x >= 0) {
                    break;
                }
            }
            if ((h & 1) == 0) {
                long count = h >>> 1;
                if (count == 0 || end - at < bytes) {
                    throw new Damaged("a run of " + chunk.path + " is empty or runs past its page");
                }
                long v = 0;
                for (int j = 0; j < bytes; j++) {
                    v |= (long) (b[at + j] & 0xff) << (8 * j);
                }
                at += bytes;
                if (v > mask) {
                    throw new Damaged("a run of " + chunk.path + " repeats a value wider than "
                                      + width + " bits");
                }
                int take = (int) Math.min(count, n - i);
                java.util.Arrays.fill(out, i, i + take, (int) v);
                i += take;
            } else {
                long groups = h >>> 1;
                if (groups == 0) {
                    throw new Damaged("an empty bit-packed run in " + chunk.path);
                }
                int take = (int) Math.min(groups * 8, n - i);
                long need = ((long) take * width + 7) / 8;
                if (end - at < need) {
                    throw new Damaged("a bit-packed run of " + chunk.path + " runs past its page");
                }
                long bit = (long) at * 8;
                for (int j = 0; j < take; j++, bit += width) {
                    int byteAt = (int) (bit >>> 3);
                    int off = (int) (bit & 7);
                    long v = 0;
                    int have = 0;
                    for (int k = byteAt; have < off + width; k++, have += 8) {
                        v |= (long) (b[k] & 0xff) << have;
                    }
                    out[i + j] = (int) ((v >>> off) & mask);
                }
                i += take;
                at += (int) Math.min(groups * width, end - at);
            }
        }
    }
}

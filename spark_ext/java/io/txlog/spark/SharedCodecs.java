package io.txlog.spark;

import org.apache.parquet.compression.CompressionCodecFactory;
import org.apache.parquet.hadoop.metadata.CompressionCodecName;

/**
 * The codec factory of the Parquet readers an input partition's objects are handed on to.
 * Each of those readers releases its factory when it is closed, at the end of its object;
 * with a factory of its own, every object then set up its decompressors again. This one
 * keeps them until {@link #close}, when the input partition is read.
 */
final class SharedCodecs implements CompressionCodecFactory {
    private final CompressionCodecFactory codecs;
    private int decompressors;
    private BytesInputDecompressor last;

    SharedCodecs(CompressionCodecFactory codecs) {
        this.codecs = codecs;
    }

    @Override
    public BytesInputCompressor getCompressor(CompressionCodecName codec) {
        return codecs.getCompressor(codec);
    }

    @Override
    public BytesInputDecompressor getDecompressor(CompressionCodecName codec) {
        BytesInputDecompressor d = codecs.getDecompressor(codec);
        if (d != last) {
            decompressors++;
            last = d;
        }
        return d;
    }

    /** How many times a decompressor other than the last one handed out was handed out
     * (for tests: 1 per codec while objects of one codec are read). */
    int decompressorsSetUp() {
        return decompressors;
    }

    /** A reader is done with its object: the decompressors stay for the next one. */
    @Override
    public void release() {
    }

    void close() {
        codecs.release();
    }
}

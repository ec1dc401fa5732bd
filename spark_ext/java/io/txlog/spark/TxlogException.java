package io.txlog.spark;

/** A txlog error raised by the Python planner: its message starts with the Python class
 * ({@code txlog.errors.ConfigError: unknown option ...}), as the Python source's errors do. */
public final class TxlogException extends IllegalArgumentException {
    private static final long serialVersionUID = 1L;

    private final String type;

    TxlogException(String type, String message) {
        super(type + ": " + message);
        this.type = type;
    }

    /** The Python class of the error, e.g. {@code txlog.errors.ConfigError}. */
    public String type() {
        return type;
    }
}

"""The Arrow memory pool that txlog's own record tables and Parquet buffers come from.

A producer or consumer moves many times its buffers through short-lived Arrow buffers
of a few MiB, allocated in one thread and freed in another.  Arrow's default allocators
keep freed pages for reuse, so a process's resident memory grew with what went through
it, not with what it held.  txlog allocates from a pool of its own: jemalloc's with its
decay time at zero, which hands freed pages back to the system at once, or, where
pyarrow was built without jemalloc, the default pool, asked to release what it does not
use after each object written.
"""

from __future__ import annotations

import threading

import pyarrow as pa

_lock = threading.Lock()
_pool: pa.MemoryPool | None = None
_returns_freed = False


def pool() -> pa.MemoryPool:
    """txlog's pool (made on first use)."""
    global _pool, _returns_freed
    if _pool is None:
        with _lock:
            if _pool is None:
                try:
                    made = pa.jemalloc_memory_pool()
                    # (a setting of Arrow's jemalloc allocator, not of the process's malloc)
                    pa.jemalloc_set_decay_ms(0)
                    _returns_freed = True
                except (NotImplementedError, pa.ArrowNotImplementedError):
                    made = pa.default_memory_pool()
                _pool = made
    return _pool


def release() -> None:
    """After an object is written: return unused memory to the system, from txlog's
    pool where it does not do so by itself, and from the default pool, which pyarrow's
    Parquet writer takes its page buffers from whatever pool it is given."""
    pool()
    # (without jemalloc, txlog's pool is the default pool)
    pa.default_memory_pool().release_unused()


def allocated() -> int:
    """Bytes the pool holds now."""
    return int(pool().bytes_allocated())

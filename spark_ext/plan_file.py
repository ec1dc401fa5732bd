"""The binary plan txlog's JVM scan reads (``io.txlog.spark.PlanFile``): the slices of a
planned read, grouped into Spark input partitions, as an Arrow IPC stream in a file on
the driver (docs/formats.md, "Scan plans").

A plan of millions of batch objects as text cost more to write, hold and parse than to
plan; as Arrow, the columns go from the planner's arrays to the JVM's without a per-object
step on the Python side, and each object is named relative to its folder (a partition's
data folder), which the plan names once.  The plan is transient: the JVM deletes the file
once read, and a version other than :data:`PLAN_VERSION` is refused on both sides.  A
plan the JVM never reads (its query failed first, or the driver went away) is removed by
the process that wrote it: by its caller on a failure (:func:`discard`), else when that
process exits (the planner process does when the driver JVM does).  The plans of a
process killed before it could (SIGKILL) are removed by the next process that writes
plans, or the next planner that starts (:mod:`spark_ext.plan_owner`).
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ext import plan_owner
from spark_ext.hadoop_conf import HadoopLocation
from spark_ext.plan_arrays import Slices
from txlog import layout
from txlog.errors import ConfigError

#: The plan format this txlog writes; the JVM connector reads only its own.
PLAN_VERSION = 1
#: The schema metadata key of the plan's header (JSON).
HEADER = b"txlog.plan"
SCHEMA = pa.schema([
    ("tp", pa.int32()),            # index into the header's "partitions"
    ("dir", pa.int32()),           # index into the header's "dirs"
    ("name", pa.string()),         # the object's name within its dir
    ("base_offset", pa.int64()),
    ("skip", pa.int64()),
    ("take", pa.int64()),
    ("append_ms", pa.int64()),
    ("nbytes", pa.int64()),
    ("object_bytes", pa.int64()),
])
_ROWS_PER_BATCH = 1 << 20
#: Plans this process wrote that may not have been read yet (their reader deletes them).
_UNREAD: set[str] = set()
_UNREAD_LOCK = threading.Lock()


def check_format(req: Mapping[str, Any]) -> None:
    """Refuse a JVM connector that reads another plan format (a jar of another txlog)."""
    got = req.get("planFormat")
    if got != PLAN_VERSION:
        raise ConfigError(
            f"txlog's JVM connector reads scan plans of format {got!r} but this txlog writes "
            f"format {PLAN_VERSION}: the jar on the Spark classpath is from another txlog "
            "version. Use the jar this txlog ships (`python -m spark_ext.jvm_scan` prints "
            "its path) in spark.jars")


def encode(s: Slices, group_ids: np.ndarray, where: HadoopLocation) -> pa.Table:
    """The plan as a table of :data:`SCHEMA` with its header; ``group_ids`` ascending."""
    dirs: dict[str, int] = {}
    dir_col, names = _folders_and_names(s, where, dirs)
    ids = np.asarray(group_ids)
    sizes = np.bincount(ids).tolist() if len(ids) else []
    if len(ids) and (np.diff(ids) < 0).any():
        raise ValueError("a plan's slices must come in group order")
    header = {"version": PLAN_VERSION, "dirs": list(dirs),
              "partitions": [[tp.topic, tp.partition] for tp in s.tps], "groups": sizes}
    columns = [pa.array(s.tp.astype(np.int32, copy=False)), pa.array(dir_col), names,
               *(pa.array(getattr(s, n).astype(np.int64, copy=False)) for n in
                 ("base_offset", "skip", "take", "append_ms", "nbytes", "object_bytes"))]
    return pa.Table.from_arrays(columns, schema=SCHEMA.with_metadata(
        {HEADER: json.dumps(header)}))


def _folders_and_names(s: Slices, where: HadoopLocation, dirs: dict[str, int],
                       ) -> tuple[np.ndarray, pa.ChunkedArray]:
    """Each slice's object as its folder's number in ``dirs`` (added as met) and its
    name in that folder."""
    if not s.shared.any():
        return _under(s.key, s.tp, s, where, dirs)
    # A topic's shared objects share one folder; the others are named per partition.
    # Each part is named in its own order, then put back in the slices'.
    own = np.flatnonzero(~s.shared)
    shared = np.flatnonzero(s.shared)
    at, folders, names = [own], [], []
    d, n = _under(s.key.take(pa.array(own)), s.tp[own], s, where, dirs)
    folders.append(d)
    names.extend(n.chunks)
    topics = sorted({tp.topic for tp in s.tps})
    topic_of = np.array([topics.index(tp.topic) for tp in s.tps], np.int32)[s.tp[shared]]
    for i, topic in enumerate(topics):
        pos = shared[topic_of == i]
        if not len(pos):
            continue
        keys = s.key.take(pa.array(pos))
        prefix = layout.shared_prefix(topic)
        at.append(pos)
        if pc.all(pc.starts_with(keys, prefix)).as_py():
            folders.append(np.full(len(pos), dirs.setdefault(where.path(prefix), len(dirs)),
                                   np.int32))
            names.extend(pc.utf8_slice_codeunits(keys, len(prefix)).chunks)
        else:
            d, n = _own_folders(keys, where, dirs)
            folders.append(d)
            names.append(n)
    back = np.empty(len(s), np.int64)
    back[np.concatenate(at)] = np.arange(len(s))
    return (np.concatenate(folders)[back],
            pa.chunked_array(names, pa.string()).take(pa.array(back)))


def _under(keys: pa.ChunkedArray, tp: np.ndarray, s: Slices, where: HadoopLocation,
           dirs: dict[str, int]) -> tuple[np.ndarray, pa.ChunkedArray]:
    """Objects of runs of one partition, named from its data folder where they are in it."""
    dir_col = np.zeros(len(keys), np.int32)
    names: list[pa.Array] = []
    runs = [0, *(np.flatnonzero(np.diff(tp)) + 1).tolist(), len(keys)] if len(keys) else [0]
    for a, b in itertools.pairwise(runs):
        part = s.tps[int(tp[a])]
        run = keys[a:b]
        prefix = layout.data_prefix(part.topic, part.partition)
        if pc.all(pc.starts_with(run, prefix)).as_py():
            dir_col[a:b] = dirs.setdefault(where.path(prefix), len(dirs))
            names.extend(_strip(run, prefix))
            continue
        # Objects elsewhere (a write's staging folder): named with their own folder.
        d, n = _own_folders(run, where, dirs)
        dir_col[a:b] = d
        names.append(n)
    return dir_col, pa.chunked_array(names, pa.string())


def _strip(keys: pa.ChunkedArray, prefix: str) -> list[pa.Array]:
    """The keys (each starting with ``prefix``) without it, chunk by chunk (an empty chunk
    has no names)."""
    cut = len(prefix.encode())
    out = []
    for chunk in keys.chunks:
        if len(chunk):
            fixed = _strip_fixed(chunk, cut)
            # (counted in code points, as len() counts them)
            out.append(pc.utf8_slice_codeunits(chunk, len(prefix)) if fixed is None
                       else fixed)
    return out


def _strip_fixed(keys: pa.Array, cut: int) -> pa.Array | None:
    """Keys of one length without their first ``cut`` bytes, cut as a matrix of bytes
    (a string kernel decodes each key's characters, which costs several times more); None
    for keys of several lengths or with nulls."""
    n = len(keys)
    if keys.type != pa.string() or keys.null_count:
        return None
    _, offset_buf, value_buf = keys.buffers()
    offsets = np.frombuffer(offset_buf, np.int32, n + 1, keys.offset * 4)
    width = int(offsets[1] - offsets[0])
    if width < cut or not (np.diff(offsets) == width).all():
        return None
    rows = np.frombuffer(value_buf, np.uint8, n * width, int(offsets[0])).reshape(n, width)
    names = np.ascontiguousarray(rows[:, cut:])
    ends = np.arange(n + 1, dtype=np.int32) * np.int32(width - cut)
    return pa.StringArray.from_buffers(n, pa.py_buffer(ends), pa.py_buffer(names))


def _own_folders(keys: pa.ChunkedArray, where: HadoopLocation, dirs: dict[str, int],
                 ) -> tuple[np.ndarray, pa.Array]:
    folders = np.zeros(len(keys), np.int32)
    own = []
    for i, key in enumerate(keys.to_pylist()):
        folder, _, name = key.rpartition("/")
        folders[i] = dirs.setdefault(where.path(folder + "/"), len(dirs))
        own.append(name)
    return folders, pa.array(own, pa.string())


def write(s: Slices, group_ids: np.ndarray, where: HadoopLocation) -> str:
    """Write the plan to a new file on this machine; returns its path (the reader deletes
    it once read)."""
    table = encode(s, group_ids, where)
    fd, path = tempfile.mkstemp(prefix=plan_owner.plan_prefix(plan_owner.token()),
                                suffix=plan_owner.PLAN_SUFFIX)
    os.close(fd)
    _track(path)
    try:
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table, max_chunksize=_ROWS_PER_BATCH)
    except BaseException:
        discard(path)
        raise
    return path


def discard(path: str) -> None:
    """Remove a plan that will not be read (its reader failed or never started); a plan
    already read and deleted is no error."""
    with _UNREAD_LOCK:
        _UNREAD.discard(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _track(path: str) -> None:
    with _UNREAD_LOCK:
        # Plans their reader has deleted are forgotten, so a long-lived planner holds
        # only those outstanding.
        for old in [p for p in _UNREAD if not os.path.exists(p)]:
            _UNREAD.discard(old)
        _UNREAD.add(path)


def remove_unread() -> None:
    """Remove the plans this process wrote that nobody read, then its lock files (at
    exit).  It takes no lock, so that a signal handler may call it whatever the
    interrupted code held."""
    for path in list(_UNREAD):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    plan_owner.release()


atexit.register(remove_unread)


def read(path: str) -> tuple[dict[str, Any], pa.Table]:
    """A plan file's header and slices (what the JVM reads; for tests and tools)."""
    with pa.OSFile(path, "rb") as src:
        table = pa.ipc.open_stream(src).read_all()
    meta = table.schema.metadata or {}
    header = json.loads(meta[HEADER])
    if header.get("version") != PLAN_VERSION:
        raise ConfigError(f"plan {path} has format {header.get('version')!r}, not "
                          f"{PLAN_VERSION}")
    return header, table

"""The shape of the txlog package: no import cycles among its modules, no module past the
size a reader can hold, and no caller that picks a strategy by a store's backend name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "txlog"
#: Lines a module may have: one past it is split by concept, not granted an exception.
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_time_imports(tree: ast.Module, name: str, is_package: bool,
                         modules: dict[str, Path]) -> set[str]:
    """The txlog modules ``name`` imports when it is imported: statements at module level
    (also inside try/if, but not under TYPE_CHECKING, and not in functions, which import
    when called)."""
    found: set[str] = set()
    base = name if is_package else name.rpartition(".")[0]

    def visit(stmts: list[ast.stmt]) -> None:
        for node in stmts:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    pkg = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                    mod = f"{pkg}.{node.module}" if node.module else pkg
                else:
                    mod = node.module or ""
                for a in node.names:
                    if f"{mod}.{a.name}" in modules:  # a submodule imported by name
                        found.add(f"{mod}.{a.name}")
                    elif mod in modules:
                        found.add(mod)
            elif isinstance(node, ast.If):
                if not _is_type_checking(node):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(tree.body)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _import_time_imports(ast.parse(path.read_text()), name,
                                       path.name == "__init__.py", modules)
            for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*path[path.index(m):], m]
            if m not in state and (cycle := visit(m)) is not None:
                return cycle
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (cycle := visit(n)) is not None:
            return cycle
    return None


def test_find_cycle_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_txlog_modules_have_no_import_cycle() -> None:
    graph = import_graph()
    assert "txlog.producer.client" in graph["txlog.producer"]  # the graph sees imports
    cycle = find_cycle(graph)
    assert cycle is None, (
        f"import cycle among txlog modules: {' -> '.join(cycle or [])}; move the shared "
        "part to a lower module, or import under TYPE_CHECKING for annotations")


@pytest.mark.parametrize("path", sorted([*PACKAGE.rglob("*.py"),
                                         *(ROOT / "spark_ext").rglob("*.py")]),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_too_long(path: Path) -> None:
    rel = str(path.relative_to(ROOT))
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, (
        f"{rel} has {lines} lines (at most {MAX_LINES}); split it by concept")


def test_callers_choose_by_store_capabilities_not_backend_names() -> None:
    """Outside txlog/storage/, no code tests a store's backend name: stores declare
    capabilities (ObjectStore.local_requests, local_files) and callers use those."""
    pattern = re.compile(r"backend\s*(==|!=|\bin\b|\bnot in\b)")
    offenders = []
    for top in ("txlog", "spark_ext"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.parts[:2] == ("txlog", "storage"):
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{rel}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_stores_declare_their_capabilities() -> None:
    from txlog.storage.local import LocalStore
    from txlog.storage.memory import MemoryStore
    from txlog.testing.faults import FaultyStore

    local, memory = LocalStore.__new__(LocalStore), MemoryStore.__new__(MemoryStore)
    assert (local.local_requests, local.local_files) == (True, True)
    assert (memory.local_requests, memory.local_files) == (True, False)
    wrapped = FaultyStore(MemoryStore("memory://caps", "caps"), seed=1)
    assert (wrapped.local_requests, wrapped.local_files) == (True, False)


def test_object_keys_are_spelled_only_in_layout() -> None:
    """Every key prefix of a root (topics, metadata, the state log, producer-id blocks,
    the clock probe) is spelled in txlog/layout.py and nowhere else in txlog."""
    pattern = re.compile(r"[\"'](_txn/|_meta/|topics/)")
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel == Path("txlog/layout.py"):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{rel}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_state_log_keys_keep_their_format() -> None:
    from txlog import layout
    from txlog.state_log import StateLogPartition
    from txlog.storage.memory import MemoryStore

    part = StateLogPartition(MemoryStore("memory://keys", "keys"), 7)
    assert part.entry_key(12_345) == "_txn/state/007/log/000001/000000012345.json"
    assert layout.state_log_checkpoint_key(7, 200) == \
        "_txn/state/007/checkpoints/000000000200.json"


def test_only_the_facade_imports_the_clients() -> None:
    """The producer, consumer and admin clients are reached through Log (txlog/log.py);
    the command line (txlog/cli/) sits above it and calls admin's functions.  No other
    txlog module imports them, in any form (also in functions or for annotations)."""
    clients = ("txlog.producer", "txlog.consumer", "txlog.admin")
    allowed = {"txlog.log", "txlog.cli"}
    offenders = []
    for name, path in _modules().items():
        if name in allowed or name.startswith(("txlog.cli.", *clients)):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                if t in clients or t.startswith(tuple(c + "." for c in clients)):
                    offenders.append(f"{name}:{getattr(node, 'lineno', '?')} imports {t}")
    assert not offenders, "\n".join(offenders)

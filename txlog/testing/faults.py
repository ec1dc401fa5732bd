"""A fault-injecting object store for tests and the torture harness.

:class:`FaultyStore` wraps any :class:`~txlog.storage.base.ObjectStore` and, driven by a
seeded random generator, injects per operation kind:

* **latency**: a random delay before the request;
* **error before**: the request is never sent; the caller gets an error;
* **error after**: the request takes effect, then the caller gets an error: the
  ambiguous outcome of a timed-out request (e.g. ``put_if_absent`` created the object but
  the caller is told it failed);
* **lost response**: the request takes effect, the response never arrives: the caller
  waits ``lost_response_ms`` and then gets a timeout.

Injected errors are :class:`InjectedStorageError` (a :class:`~txlog.errors.StorageError`,
which is what the real remote backends raise once their own retries are exhausted) or,
with ``error_style="os"``, :class:`InjectedTimeout` (a :class:`TimeoutError`, an
``OSError``, which is what a raw filesystem call can raise); ``"mixed"`` picks either.
Never :class:`~txlog.errors.ObjectNotFoundError`: "missing" has a meaning of its own.

The store is picklable (the inner store, the seed and the rates travel; the counts of
injected faults start again at zero), so it can be handed to worker processes.  Give each
process its own ``seed`` (or ``stream``) or they all inject the same sequence.

    store = FaultyStore(open_store(url), seed=7,
                        rates={"put_if_absent": FaultRates(error_after=0.05), "*": FaultRates(
                            latency=0.2, latency_ms=5)})
    with store.paused():
        ...  # no faults here
    store.injected  # Counter({"put_if_absent.error_after": 3, ...})
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from txlog.errors import ConfigError, StorageError
from txlog.storage.base import ObjectStore
from txlog.testing.delegating import DelegatingStore

#: Operation kinds faults can be configured for.
OPS = ("put_if_absent", "put", "get", "get_range", "list", "delete", "size")
#: Kinds of injected fault, as they appear in :attr:`FaultyStore.injected` keys.
FAULT_KINDS = ("latency", "error_before", "error_after", "lost_response")
ERROR_STYLES = ("storage", "os", "mixed")

_T = TypeVar("_T")


class InjectedStorageError(StorageError):
    """A fault injected by :class:`FaultyStore` (a storage error as a real backend raises)."""


class InjectedTimeout(TimeoutError):
    """A fault injected by :class:`FaultyStore` as a raw OS-level timeout."""


@dataclass(frozen=True)
class FaultRates:
    """Probabilities (0..1) of each fault for one operation kind."""

    latency: float = 0.0  # probability of an added delay
    latency_ms: float = 0.0  # the delay is uniform in [0, latency_ms]
    error_before: float = 0.0  # no effect, error
    error_after: float = 0.0  # effect, then error (ambiguous)
    lost_response: float = 0.0  # effect, then a wait of lost_response_ms, then a timeout

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"FaultRates.{name} must be a number >= 0, not {value!r}")
            if name != "latency_ms" and value > 1:
                raise ConfigError(f"FaultRates.{name} is a probability (0..1), not {value!r}")
        if self.error_before + self.error_after + self.lost_response > 1:
            raise ConfigError("FaultRates: error_before + error_after + lost_response > 1")

    @property
    def quiet(self) -> bool:
        return not (self.latency or self.error_before or self.error_after or self.lost_response)


NO_FAULTS = FaultRates()


def _rates_table(rates: FaultRates | Mapping[str, FaultRates] | None) -> dict[str, FaultRates]:
    if rates is None:
        return dict.fromkeys(OPS, NO_FAULTS)
    if isinstance(rates, FaultRates):
        return dict.fromkeys(OPS, rates)
    unknown = set(rates) - set(OPS) - {"*"}
    if unknown:
        raise ConfigError(
            f"unknown operation kinds {sorted(unknown)} in fault rates; kinds: {', '.join(OPS)}"
            " or '*' for the default")
    for op, r in rates.items():
        if not isinstance(r, FaultRates):
            raise ConfigError(f"fault rates for {op!r} must be a FaultRates, not {r!r}")
    default = rates.get("*", NO_FAULTS)
    return {op: rates.get(op, default) for op in OPS}


class FaultyStore(DelegatingStore):
    """Wraps ``inner``; injects faults per operation kind with a seeded generator."""

    def __init__(self, inner: ObjectStore, seed: int = 0,
                 rates: FaultRates | Mapping[str, FaultRates] | None = None, *,
                 stream: str = "", error_style: str = "storage",
                 lost_response_ms: float = 50.0, enabled: bool = True) -> None:
        super().__init__(inner)
        if error_style not in ERROR_STYLES:
            raise ConfigError(
                f"error_style must be one of {ERROR_STYLES}, not {error_style!r}")
        self.seed = seed
        self.stream = stream
        self.rates = _rates_table(rates)
        self.error_style = error_style
        self.lost_response_ms = float(lost_response_ms)
        self.enabled = enabled
        self._lock = threading.Lock()
        self._rng = random.Random(f"{seed}:{stream}")
        #: Injected faults by "<op>.<kind>" (e.g. "put_if_absent.error_after").
        self.injected: Counter[str] = Counter()
        #: Requests seen by kind (injected or not).
        self.requests: Counter[str] = Counter()
        # Scripted faults: [op, key prefix, fault kind, remaining count].
        self._scripted: list[list[Any]] = []

    # -- pickling ------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {"inner": self.inner, "seed": self.seed, "stream": self.stream,
                "rates": self.rates, "error_style": self.error_style,
                "lost_response_ms": self.lost_response_ms, "enabled": self.enabled}

    def __setstate__(self, s: dict[str, Any]) -> None:
        self.__init__(s["inner"], s["seed"], s["rates"], stream=s["stream"],  # type: ignore[misc]
                      error_style=s["error_style"], lost_response_ms=s["lost_response_ms"],
                      enabled=s["enabled"])

    def __repr__(self) -> str:
        return f"FaultyStore({self.inner!r}, seed={self.seed}, stream={self.stream!r})"

    # -- control -------------------------------------------------------------------------

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No faults inside the block (restores the previous setting on exit)."""
        was = self.enabled
        self.enabled = False
        try:
            yield
        finally:
            self.enabled = was

    def script(self, op: str, prefix: str = "", fault: str = "error_before",
               times: int = 1) -> None:
        """Inject ``fault`` into the next ``times`` requests of kind ``op`` whose key
        starts with ``prefix`` (deterministic, whatever the rates; even when paused)."""
        if op not in OPS:
            raise ConfigError(f"unknown operation kind {op!r}; kinds: {', '.join(OPS)}")
        if fault not in FAULT_KINDS or fault == "latency":
            raise ConfigError(f"scripted faults are error_before, error_after or "
                              f"lost_response, not {fault!r}")
        with self._lock:
            self._scripted.append([op, prefix, fault, times])

    def total_injected(self, kinds: tuple[str, ...] = FAULT_KINDS) -> int:
        with self._lock:
            return sum(n for k, n in self.injected.items() if k.rsplit(".", 1)[1] in kinds)

    def injected_by_kind(self) -> dict[str, int]:
        """Injected faults summed over operations: {"latency": n, "error_before": n, ...}."""
        out = dict.fromkeys(FAULT_KINDS, 0)
        with self._lock:
            for k, n in self.injected.items():
                out[k.rsplit(".", 1)[1]] += n
        return out

    # -- the injection ---------------------------------------------------------------------

    def _draw(self, op: str, key: str) -> tuple[float, str | None, str]:
        """(delay seconds, fault kind or None, error style) for one request of ``op``."""
        with self._lock:
            self.requests[op] += 1
            for s in self._scripted:
                if s[0] == op and key.startswith(s[1]) and s[3] > 0:
                    s[3] -= 1
                    self.injected[f"{op}.{s[2]}"] += 1
                    style = "os" if self.error_style == "os" else "storage"
                    return 0.0, s[2], style
            r = self.rates[op]
            if not self.enabled or r.quiet:
                return 0.0, None, self.error_style
            delay = 0.0
            if r.latency and self._rng.random() < r.latency:
                delay = self._rng.uniform(0, r.latency_ms) / 1000
                self.injected[f"{op}.latency"] += 1
            x = self._rng.random()
            fault: str | None = None
            if x < r.error_before:
                fault = "error_before"
            elif x < r.error_before + r.error_after:
                fault = "error_after"
            elif x < r.error_before + r.error_after + r.lost_response:
                fault = "lost_response"
            if fault is not None:
                self.injected[f"{op}.{fault}"] += 1
            style = self.error_style
            if style == "mixed":
                style = "os" if self._rng.random() < 0.5 else "storage"
            return delay, fault, style

    def _error(self, op: str, key: str, fault: str, style: str) -> Exception:
        what = {"error_before": "failed before it was sent",
                "error_after": "timed out after it took effect",
                "lost_response": "got no response (it took effect)"}[fault]
        msg = f"injected fault: {op} of {key!r} in {self.url} {what}"
        if style == "os":
            return InjectedTimeout(msg)
        return InjectedStorageError(msg)

    def _call(self, op: str, key: str, fn: Callable[..., _T], *args: Any) -> _T:
        delay, fault, style = self._draw(op, key)
        if delay:
            time.sleep(delay)
        if fault == "error_before":
            raise self._error(op, key, fault, style)
        result = fn(*args)
        if fault == "error_after":
            raise self._error(op, key, fault, style)
        if fault == "lost_response":
            if self.lost_response_ms:
                time.sleep(self.lost_response_ms / 1000)
            raise self._error(op, key, fault, style)
        return result

    # -- delegated too: a Log on this store checks the inner store ------------------------

    def check_atomic_create(self) -> None:
        self.inner.check_atomic_create()

"""The torture harness: concurrent client processes under faults, recorded as histories
and judged by :mod:`txlog.testing.checker`.

    from txlog.testing.harness import HistoryConfig, run_history
    result = run_history(HistoryConfig(seed=1, workdir=tmp))
    assert not result.anomalies

Modules: :mod:`~txlog.testing.harness.history` (JSONL event files),
:mod:`~txlog.testing.harness.worker`
(the client processes: producers, consumers, consume-transform-produce, sweeper),
:mod:`~txlog.testing.harness.runner` (one history: set-up, nemesis, final sweep and reads, check).
"""

from txlog.testing.harness.runner import HistoryConfig, HistoryResult, run_history

__all__ = ["HistoryConfig", "HistoryResult", "run_history"]

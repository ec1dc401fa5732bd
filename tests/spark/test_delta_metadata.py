"""txlog's entry in a Delta commit's userMetadata: the batch job settles a round
from it after a crash, so what it reads there is validated, not trusted."""

from __future__ import annotations

import json

import pytest

from spark_ext.delta import DeltaSinkStateError, is_path, parse_user_metadata, user_metadata


def test_round_trip() -> None:
    text = user_metadata(app="txlog-eos-g", round=3, group="g", topic="orders",
                         start={"0": 10, "1": 0}, end={"0": 20, "1": 5})
    assert parse_user_metadata(text) == {"app": "txlog-eos-g", "round": 3, "group": "g",
                                         "topic": "orders", "start": {"0": 10, "1": 0},
                                         "end": {"0": 20, "1": 5}}


@pytest.mark.parametrize("text", [None, "", "not json", "[1, 2]", '{"other": {"app": "a"}}',
                                  '{"txlog": {"app": "a"}}', '{"txlog": {"round": 1}}',
                                  '{"txlog": {"app": "a", "round": true}}'])
def test_other_writers_metadata_is_not_ours(text: str | None) -> None:
    assert parse_user_metadata(text) is None


@pytest.mark.parametrize("offsets", [None, [1], {"0": -1}, {"x": 1}, {"0": "5"}, {"0": 1.5},
                                     {"0": True}])
def test_a_malformed_range_stops_the_job(offsets: object) -> None:
    text = json.dumps({"txlog": {"app": "a", "round": 1, "start": {"0": 0}, "end": offsets}})
    with pytest.raises(DeltaSinkStateError, match="malformed 'end'"):
        parse_user_metadata(text)


def test_tables_by_path_or_by_name() -> None:
    assert is_path("/data/t") and is_path("s3a://b/t") and is_path("file:/tmp/t")
    assert not is_path("orders") and not is_path("db.orders")

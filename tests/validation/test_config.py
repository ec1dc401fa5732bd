"""Configuration: the documented conf file, precedence, and unknown keys."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import txlog
from txlog.config import DEFAULTS, TOPIC_KEYS, load_config
from txlog.errors import ConfigError

CONF = Path(__file__).resolve().parents[2] / "conf" / "txlog.toml"
PLAIN_DEFAULTS = {k: v[0] for k, v in DEFAULTS.items()}


def test_conf_file_loads_and_equals_the_defaults() -> None:
    cfg = load_config(env={"TXLOG_CONF": str(CONF)})
    assert cfg == PLAIN_DEFAULTS


def test_conf_file_sets_every_key_with_its_help_as_a_comment() -> None:
    text = CONF.read_text()
    assigned = re.findall(r"^([a-z][a-z0-9_.]*)\s*=", text, flags=re.M)
    assert sorted(assigned) == sorted(DEFAULTS), (
        "conf/txlog.toml must set every key of txlog.config.DEFAULTS exactly once")
    lines = text.splitlines()
    for key, (_, _, help_text) in DEFAULTS.items():
        i = next(n for n, line in enumerate(lines) if line.startswith(f"{key} ="))
        assert lines[i - 1] == f"# {help_text}", f"{key}: the line above must be its help"
    for key in TOPIC_KEYS:
        assert key in text


def test_precedence_defaults_file_env_explicit(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text("transaction.timeout.ms = 1000\nlinger.ms = 7\nnum.partitions = 3\n")
    env = {"TXLOG_CONF": str(conf), "TXLOG_LINGER_MS": "9", "TXLOG_NUM_PARTITIONS": "4"}
    cfg = load_config({"num.partitions": 5}, env=env)
    assert cfg["transaction.timeout.ms"] == 1000  # file over default
    assert cfg["linger.ms"] == 9  # env over file
    assert cfg["num.partitions"] == 5  # explicit over env
    assert cfg["batch.size"] == DEFAULTS["batch.size"][0]


def test_quoted_and_table_forms_of_keys(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text('"retention.ms" = 10\n[segment]\nbytes = 20\n')
    cfg = load_config(env={"TXLOG_CONF": str(conf)})
    assert cfg["retention.ms"] == 10 and cfg["segment.bytes"] == 20


def test_unknown_keys_are_errors_everywhere(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text("transaction.timout.ms = 1\n")
    with pytest.raises(ConfigError, match=r"transaction\.timout\.ms"):
        load_config(env={"TXLOG_CONF": str(conf)})
    with pytest.raises(ConfigError, match="TXLOG_LINGER"):
        load_config(env={"TXLOG_LINGER": "1"})
    with pytest.raises(ConfigError, match="lingr"):
        load_config({"lingr.ms": 1}, env={})
    unknown: dict[str, Any] = {"no.such.key": 1}
    with pytest.raises(ConfigError):
        txlog.connect("memory://cfg/unknown", **unknown)


def test_bad_values_and_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"integer|int"):
        load_config({"linger.ms": "soon"}, env={})
    with pytest.raises(ConfigError, match="true or false"):
        load_config({"enable.idempotence": "maybe"}, env={})
    assert load_config(env={"TXLOG_ENABLE_IDEMPOTENCE": "false"})["enable.idempotence"] is False
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(env={"TXLOG_CONF": str(tmp_path / "missing.toml")})
    bad = tmp_path / "bad.toml"
    bad.write_text("linger.ms = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(env={"TXLOG_CONF": str(bad)})


def test_non_config_variables_are_not_keys() -> None:
    env = {"TXLOG_ROOT": "/x", "TXLOG_STORAGE_OPTIONS": "{}", "TXLOG_TEST_BACKENDS": "memory"}
    assert load_config(env=env) == PLAIN_DEFAULTS


def test_python_style_names_and_topic_config() -> None:
    log = txlog.connect("memory://cfg/py", transaction_timeout_ms=1234)
    assert log.config["transaction.timeout.ms"] == 1234
    info = log.create_topic("t", partitions=1, config={"retention.ms": "5000"})
    assert info.config["retention.ms"] == 5000
    with pytest.raises(ConfigError, match="not a topic configuration"):
        log.create_topic("u", config={"linger.ms": 1})


# -- types and ranges ---------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value"), [
    ("batch.size", -1), ("linger.ms", -100), ("buffer.memory", 0), ("max.poll.records", -3),
    ("segment.bytes", 0), ("transaction.state.log.num.partitions", 0),
    ("offsets.topic.num.partitions", 0), ("num.partitions", 0), ("retries", -1),
    ("checkpoint.interval.batches", 0), ("retention.ms", -2), ("transaction.timeout.ms", 0),
    ("max.request.size", 0), ("fetch.max.bytes", -1), ("linger.ms", 2**31),
    ("retention.bytes", 2**63), ("socket.connection.setup.timeout.ms", 0),
])
def test_values_out_of_range_are_refused_everywhere(key: str, value: int,
                                                    tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(key) + ".* from -?[0-9]+ to [0-9]+"):
        load_config({key: value}, env={})
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(env={"TXLOG_" + key.replace(".", "_").upper(): str(value)})
    conf = tmp_path / "c.toml"
    conf.write_text(f'"{key}" = {value}\n')
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(env={"TXLOG_CONF": str(conf)})


@pytest.mark.parametrize("text", ["1.5", "1e3", "5.0", "inf", "nan", "1_0.0"])
def test_toml_floats_are_refused_not_truncated(text: str, tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text(f'"linger.ms" = {text}\n')
    with pytest.raises(ConfigError, match=r"linger\.ms.* integer"):
        load_config(env={"TXLOG_CONF": str(conf)})
    with pytest.raises(ConfigError, match=r"linger\.ms"):
        load_config(env={"TXLOG_LINGER_MS": text})
    with pytest.raises(ConfigError, match=r"linger\.ms"):
        load_config({"linger.ms": float(text.replace("_", ""))}, env={})


def test_integers_in_text_and_limits_are_accepted() -> None:
    cfg = load_config({"linger.ms": " 7 ", "retention.ms": "-1", "batch.size": "1_024",
                       "retention.bytes": 2**63 - 1}, env={})
    assert (cfg["linger.ms"], cfg["retention.ms"], cfg["batch.size"]) == (7, -1, 1024)
    with pytest.raises(ConfigError, match=r"not '9+\.\.\.$"):
        load_config({"linger.ms": "9" * 1000}, env={})  # a huge value is cut in the error


def test_topic_and_client_options_are_range_checked() -> None:
    log = txlog.connect("memory://cfg/ranges")
    with pytest.raises(ConfigError, match=r"segment\.bytes"):
        log.create_topic("t", config={"segment.bytes": 0})
    with pytest.raises(ConfigError, match=r"batch\.size"):
        log.producer(batch_size=-1)
    with pytest.raises(ConfigError, match=r"max\.poll\.records"):
        log.consumer(max_poll_records=-3)
    with pytest.raises(ConfigError, match=r"transaction\.state\.log\.num\.partitions"):
        txlog.connect("memory://cfg/ranges2", transaction_state_log_num_partitions=0)


@pytest.mark.parametrize("path", ["/dev/zero", "big"])
def test_txlog_conf_is_read_with_a_bound(path: str, tmp_path: Path) -> None:
    if path == "big":
        big = tmp_path / "big.toml"
        big.write_text("# " + "x" * (2 << 20) + "\n")
        path = str(big)
    elif not Path(path).exists():
        pytest.skip(f"{path} does not exist here")
    with pytest.raises(ConfigError, match="larger than 1048576 bytes"):
        load_config(env={"TXLOG_CONF": path})

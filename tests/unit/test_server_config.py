"""The server's config is validated at start (scheduler/server/config_schema.py): a wrong type, a
value out of range or an unknown key is refused, naming the key and where it came from."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scheduler.core.policy_config import PolicyConfig
from scheduler.server.config import ConfigError, load_settings
from scheduler.server.config_schema import PolicyTable


@pytest.fixture(autouse=True)
def no_gsched_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for var in [v for v in os.environ if v.startswith("GSCHED_")]:
        monkeypatch.delenv(var)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gsched.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text,words", [
    ('port = "abc"', ["gsched.toml", "port", "integer"]),
    ('port = "8470"', ["port", "integer"]),  # TOML has integers: a quoted one is a mistake
    ("port = 70000", ["port", "65535"]),
    ("port = true", ["port"]),
    ("cycle_interval_s = 0", ["cycle_interval_s", "greater than 0"]),
    ('cycle_interval_s = "soon"', ["cycle_interval_s", "not a duration"]),
    ("max_connections = 0", ["max_connections", "greater than or equal to 1"]),
    ("prot = 8470", ["prot", "unknown key", "known:", "port"]),
    ("[policy]\nlocality_wiat_s = 3", ["policy.locality_wiat_s", "unknown key", "locality_wait_s"]),
    ('[policy]\ncandidates_per_job = "4"', ["policy.candidates_per_job", "integer"]),
    ("[policy]\nmin_runtime_backoff = 0.5", ["policy.min_runtime_backoff", "greater than or equal to 1"]),
    ("[policy]\nstage_penalty = 1.5", ["policy.stage_penalty", "less than or equal to 1"]),
    ("[policy]\nstage_penalty = -0.1", ["policy.stage_penalty", "greater than or equal to 0"]),
    ("[network]\nsame_rack_gbps = -1", ["network.same_rack_gbps", "greater than 0"]),
    ("[network]\nmoon_gbps = 1", ["network.moon_gbps", "unknown key", "same_rack_gbps"]),
    ('[users]\nalice = "lots"', ["users.alice", "number"]),
    ("policy = 3", ["policy"]),
])
def test_a_bad_file_is_refused_naming_the_key(tmp_path: Path, text: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(write(tmp_path, text))
    for w in words:
        assert w in str(e.value), f"{w!r} not in {e.value}"


@pytest.mark.parametrize("text,key,seconds", [
    ("cycle_interval_s = 0.5", "cycle_interval_s", 0.5),
    ("heartbeat_ttl_s = 20", "heartbeat_ttl_s", 20.0),
    ('heartbeat_ttl_s = "1m"', "heartbeat_ttl_s", 60.0),
    ('[policy]\nusage_half_life_s = "7-00:00:00"', "policy.usage_half_life_s", 7 * 86400.0),
    ('[policy]\nmax_wait_s = "2h30m"', "policy.max_wait_s", 9000.0),
    ('[policy]\nlocality_wait_s = "0:30"', "policy.locality_wait_s", 30.0),  # MM:SS
    ('[policy]\npreempt_locality_wait_s = "45m"', "policy.preempt_locality_wait_s", 2700.0),
    ('[policy]\npreempt_equal_loss_s = "10m"', "policy.preempt_equal_loss_s", 600.0),
    ('[policy]\npreempt_data_wait_s = "20m"', "policy.preempt_data_wait_s", 1200.0),
    ('[policy]\npreempt_wide_window_s = "1d"', "policy.preempt_wide_window_s", 86400.0),
])
def test_durations_take_the_one_grammar(tmp_path: Path, text: str, key: str, seconds: float) -> None:
    got: object = load_settings(write(tmp_path, text))
    for part in key.split("."):
        got = getattr(got, part)
    assert got == seconds


def test_network_is_given_in_gbps_and_kept_in_bytes_per_second(tmp_path: Path) -> None:
    got = load_settings(write(tmp_path, "[network]\nsame_rack_gbps = 8\ncross_rack_gbps = 4"))
    assert (got.policy.same_rack_bps, got.policy.cross_rack_bps) == (1e9, 5e8)  # 8 Gb/s = 1 GB/s


def test_environment_is_text_read_by_the_same_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSCHED_PORT", "9000")
    monkeypatch.setenv("GSCHED_LOCALITY_WAIT_S", "1m")
    monkeypatch.setenv("GSCHED_HEARTBEAT_S", "0.5")
    got = load_settings(write(tmp_path, "port = 8000"))
    assert (got.port, got.policy.locality_wait_s, got.heartbeat_s) == (9000, 60.0, 0.5)  # env wins over the file
    monkeypatch.setenv("GSCHED_PORT", "abc")
    with pytest.raises(ConfigError, match="environment: GSCHED_PORT: .*integer"):
        load_settings(write(tmp_path, ""))


def test_flags_win_and_are_checked_too(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, "port = 8000"), port=8001).port == 8001
    with pytest.raises(ConfigError, match="command line: port"):
        load_settings(write(tmp_path, ""), port=0)


def test_the_policy_table_has_every_policy_knob() -> None:
    assert set(PolicyTable.model_fields) == {f.name for f in dataclasses.fields(PolicyConfig)}


def test_a_good_file_keeps_what_it_does_not_set(tmp_path: Path) -> None:
    got = load_settings(write(tmp_path, 'host = "0.0.0.0"\n[users]\nalice = 2'))
    assert (got.host, got.port, got.users, got.policy) == ("0.0.0.0", 8470, {"alice": 2.0}, PolicyConfig())


def test_peer_ca_must_be_a_pem_ca_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("no certificate here")
    with pytest.raises(ConfigError, match="peer_ca: .*ca.pem holds no PEM CA certificate"):
        load_settings(str(write(tmp_path, f'peer_ca = "{ca}"')))
    monkeypatch.setenv("GSCHED_PEER_CA", str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="peer_ca: .*missing.pem is not a readable file"):
        load_settings(None)


def test_stage_penalty_is_read_from_the_policy_table(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, "[policy]\npreempt = true")).policy.stage_penalty == 0.3
    assert load_settings(write(tmp_path, "[policy]\nstage_penalty = 0")).policy.stage_penalty == 0.0


def test_min_runtime_backoff_is_read_from_the_policy_table(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, "[policy]\npreempt = true")).policy.min_runtime_backoff == 2.0
    assert load_settings(write(tmp_path, "[policy]\nmin_runtime_backoff = 1")).policy.min_runtime_backoff == 1.0

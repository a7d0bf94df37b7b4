"""The disk floor (scheduler/core/diskfloor.py): which reported free disk holds a node back, and the
words ``gsched nodes`` and ``gsched explain`` show for it."""

from __future__ import annotations

import pytest

from scheduler.core.diskfloor import GB, floor_bytes, floor_reason, under_floor
from scheduler.server.config import ConfigError, load_settings

MB = 1_000_000


@pytest.mark.parametrize(("free", "floor", "held_back"), [
    (4 * GB, 5 * GB, True),       # under the floor
    (5 * GB, 5 * GB, False),      # at the floor: still takes work
    (1, 5 * GB, True),            # a full disk (the agent reports at least 1 byte)
    (0, 5 * GB, False),           # 0: not reported (a node that never said), not held back
    (None, 5 * GB, False),
    (1 * MB, 0, False),           # floor 0: off
])
def test_a_node_is_held_back_only_when_it_reported_less_than_the_floor(free, floor, held_back) -> None:  # type: ignore[no-untyped-def]
    assert under_floor(free, floor) is held_back


def test_the_reason_names_free_bytes_floor_and_key() -> None:
    # 12 MB free under a floor of 0.03 GB = 30 MB
    assert floor_reason(12 * MB, floor_bytes(0.03)) == "low disk: 12.0 MB free, under the 30.0 MB floor (disk_floor_gb)"
    assert floor_reason(3 * GB, floor_bytes(5)) == "low disk: 3.0 GB free, under the 5.0 GB floor (disk_floor_gb)"
    assert floor_reason(6 * GB, floor_bytes(5)) == ""


def test_the_floor_is_a_server_setting_with_a_default_and_an_environment_variable(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    assert load_settings().disk_floor_bytes == 5 * GB
    monkeypatch.setenv("GSCHED_DISK_FLOOR_GB", "0.03")
    assert load_settings().disk_floor_bytes == 30 * MB
    (tmp_path / "g.toml").write_text("disk_floor_gb = -1\n")
    monkeypatch.delenv("GSCHED_DISK_FLOOR_GB")
    with pytest.raises(ConfigError, match="disk_floor_gb"):
        load_settings(tmp_path / "g.toml")

"""The throw-away PostgreSQL the tests and the benchmarks share (scheduler/store/throwaway_postgres.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.cli.localcluster import free_port
from scheduler.store import throwaway_postgres
from scheduler.store.db import Database
from scheduler.store.throwaway_postgres import ThrowawayPostgres, unavailable


def test_unavailable_names_the_missing_binaries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(throwaway_postgres, "PG_BIN", tmp_path)
    why = unavailable()
    assert why is not None and str(tmp_path) in why


def test_durable_cluster_keeps_the_defaults_and_is_removed_on_stop() -> None:
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    pg = ThrowawayPostgres(free_port(), durable=True, max_connections=50)
    root = pg.root
    try:
        d = Database(pg.new_database())
        try:
            with d.engine.connect() as conn:
                settings = {k: conn.exec_driver_sql(f"SHOW {k}").scalar()
                            for k in ("fsync", "synchronous_commit", "full_page_writes", "max_connections")}
            d.upgrade()
            assert d.current_revision() is not None
        finally:
            d.dispose()
        assert settings == {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
                            "max_connections": "50"}
        assert pg.new_database() != pg.url("postgres")
    finally:
        pg.stop()
    assert not root.exists()


def test_test_cluster_trades_durability_for_speed(postgres: ThrowawayPostgres) -> None:
    d = Database(postgres.new_database())
    try:
        with d.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW fsync").scalar() == "off"
            assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "off"
    finally:
        d.dispose()

"""The store tests' database: a fresh one of each backend (``db_url``), migrated to head."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scheduler.store.db import Database


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    d = Database(db_url)
    d.upgrade()
    yield d
    d.dispose()

"""``metrics_token``: with it set, ``/metrics`` answers only a scraper that sends it (a real server)."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from scheduler.cli.localcluster import LocalCluster

pytestmark = pytest.mark.integration

SCRAPER = "metrics-" + "k" * 32


def get(url: str, token: str | None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metrics_need_the_metrics_token_when_one_is_set(tmp_path: Path) -> None:
    config = tmp_path / "gsched.toml"
    config.write_text(f'metrics_token = "{SCRAPER}"\n')
    c = LocalCluster(tmp_path / "c", [], config=str(config))
    try:
        c.start_server()
        url = c.url.split(",")[0] + "/metrics"
        user = c.add_user("alice")
        for token in (None, "wrong", user, c.admin_token(), SCRAPER[:-1]):
            status, body = get(url, token)
            # 401 and nothing of the metrics: user names are in them
            assert status == 401, (token, status, body)
            assert "gsched_" not in body and "alice" not in body
        assert "metrics_token" in get(url, None)[1]  # the scraper's operator learns what is missing
        status, body = get(url, SCRAPER)
        assert status == 200 and "gsched_" in body
    finally:
        c.close()

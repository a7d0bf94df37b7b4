"""The fair-share account tree on a real server and SQLite: accounts and users added with the CLI,
usage rolled up in ``gsched share`` (like ``sshare -l``), the snapshot the cycle decides over, bad
input refused with the field named and nothing stored, every change in the event log."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from scheduler.cli.localcluster import LocalCluster
from scheduler.core.fairshare import queue_order
from scheduler.core.policy_config import PolicyConfig
from scheduler.store.db import Database
from scheduler.store.models import Usage
from scheduler.store.snapshot_reader import build_snapshot

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # root -> physics (60) {alice, bob}, bio (39) {carol}, admin (1 share, no account: under root);
    # physics -> theory (1), empty for now.  Shares under root add up to 100.
    c = LocalCluster(tmp_path_factory.mktemp("accounts"), [])
    c.start_server()
    c.cli("account", "add", "physics", "--shares", "60")
    c.cli("account", "add", "bio", "--shares", "39")
    c.cli("account", "add", "theory", "--parent", "physics")
    for user, account in (("alice", "physics"), ("bob", "physics"), ("carol", "bio")):
        c.cli("user", "add", user, "--account", account)
    yield c
    c.close()


def rows(c: LocalCluster) -> dict[str, dict]:  # type: ignore[type-arg]
    out = json.loads(c.cli("share", "--json").stdout)
    return {(r["user"] or r["account"]): r for r in out}


def test_share_json_has_the_sshare_long_columns_and_the_tree(tree: LocalCluster) -> None:
    out = json.loads(tree.cli("share", "--json").stdout)
    assert list(out[0]) == ["account", "user", "raw_shares", "norm_shares", "raw_usage", "norm_usage",
                            "effective_usage", "factor", "held_devices", "asked_devices", "fair_part"]
    by = {(r["user"] or r["account"]): r for r in out}
    # physics 60/100 = 0.6; theory 0.6 * 1/(1 + 1 + 1) (theory, alice, bob) = 0.2; alice the same
    assert by["physics"]["norm_shares"] == pytest.approx(0.6)
    assert by["theory"]["norm_shares"] == pytest.approx(0.2)
    assert by["alice"]["account"] == "physics" and by["alice"]["norm_shares"] == pytest.approx(0.2)
    assert by["carol"]["norm_shares"] == pytest.approx(0.39)
    assert by["admin"]["account"] == "root"  # a user with no account hangs under root: 1/100
    assert by["admin"]["norm_shares"] == pytest.approx(0.01)
    text = tree.cli("share").stdout
    assert "EffectvUsage" in text and "physics" in text and "theory" in text
    # no agent, no devices: nobody holds, asks for or has a part of any (tests/db/test_preempt_cycle.py
    # has them with jobs)
    assert {(r["held_devices"], r["asked_devices"], r["fair_part"]) for r in out} == {(0, 0, 0)}
    assert text.splitlines()[0].split()[-3:] == ["Held", "Asked", "FairPart"]


def test_usage_rolls_up_and_the_cycle_sees_the_tree(tree: LocalCluster) -> None:
    # usage alice 600, carol 400 (device-seconds, as of now).  Without the admin's usage (0), as in
    # tests/unit/test_accounts.py: physics U 0.6, UE 0.6, F 0.5; alice UE 0.6, S = 0.6 * 1/3 = 0.2,
    # F = 2^(-3); bob U 0, UE = 0 + (0.6 - 0) * 1/3 = 0.2, F = 2^(-1); carol S 0.39, UE 0.4,
    # F = 2^(-0.4 / 0.39).
    db = Database(f"sqlite:///{tree.home / 'gsched.db'}")
    now = time.time()
    with db.session() as s:
        s.add(Usage(user="alice", device_seconds=600.0, updated_at=now))
        s.add(Usage(user="carol", device_seconds=400.0, updated_at=now))
    by = rows(tree)
    assert by["physics"]["raw_usage"] == pytest.approx(600, rel=1e-3)
    assert by["root"]["raw_usage"] == pytest.approx(1000, rel=1e-3)
    assert by["alice"]["factor"] == pytest.approx(2**-3, rel=1e-3)
    assert by["bob"]["effective_usage"] == pytest.approx(0.2, rel=1e-3)
    assert by["bob"]["factor"] == pytest.approx(0.5, rel=1e-3)
    assert by["carol"]["factor"] == pytest.approx(2 ** (-0.4 / 0.39), rel=1e-3)
    with db.read() as s:
        snap = build_snapshot(s, now)
    assert snap.user_account == {"alice": "physics", "bob": "physics", "carol": "bio"}
    assert snap.accounts["theory"].parent == "physics"
    # the per-user view (queue, metrics) agrees with the tree
    users = {u["user"]: u for u in tree.admin().get("/v1/share")}
    assert users["bob"]["factor"] == pytest.approx(0.5, rel=1e-3) and users["bob"]["account"] == "physics"
    assert queue_order(snap, PolicyConfig())[0] == []  # nothing pending; the factors come from the tree
    # moving bob to bio: bio now has carol and bob (1 share each): S = 0.39 * 1/2 = 0.195 each;
    # bob UE = 0 + (0.4 - 0) * 1/2 = 0.2 -> F = 2^(-0.2 / 0.195); alice is alone in physics with
    # theory: S = 0.6 * 1/2 = 0.3, UE 0.6 -> F = 2^(-2)
    tree.cli("user", "account", "bob", "bio")
    by = rows(tree)
    assert by["bob"]["account"] == "bio" and by["bob"]["norm_shares"] == pytest.approx(0.195)
    assert by["bob"]["factor"] == pytest.approx(2 ** (-0.2 / 0.195), rel=1e-3)
    assert by["alice"]["factor"] == pytest.approx(0.25, rel=1e-3)


def test_bad_input_names_the_field_and_stores_nothing(tree: LocalCluster) -> None:
    out = tree.cli("user", "add", "dave", "--account", "nowhere", check=False)
    assert out.returncode == 2 and "account" in out.stderr and "nowhere" in out.stderr
    assert "dave" not in {u["name"] for u in tree.admin().get("/v1/users")}
    out = tree.cli("account", "add", "x", "--parent", "nowhere", check=False)
    assert out.returncode == 2 and "parent" in out.stderr
    out = tree.cli("account", "add", "physics", check=False)
    assert out.returncode == 2 and "already exists" in out.stderr
    out = tree.cli("account", "add", "root", check=False)
    assert out.returncode == 2 and "name" in out.stderr
    # physics -> theory: moving physics under theory would be a loop
    out = tree.cli("account", "move", "physics", "theory", check=False)
    assert out.returncode == 2 and "loop" in out.stderr
    assert {a["name"]: a["parent"] for a in tree.admin().get("/v1/accounts")} == {
        "bio": "root", "physics": "root", "theory": "physics"}
    tree.cli("account", "move", "theory", "root")
    assert {a["name"]: a["parent"] for a in tree.admin().get("/v1/accounts")}["theory"] == "root"


def test_every_account_change_is_in_the_event_log(tree: LocalCluster) -> None:
    tree.cli("account", "add", "audit")
    tree.cli("user", "add", "erin")
    tree.cli("user", "account", "erin", "audit")
    kinds = {(e["kind"], e["message"]) for e in tree.admin().get("/v1/events", limit=1000)}
    assert ("account.add", "audit parent=root shares=1") in kinds
    assert ("user.account", "erin root -> audit") in kinds
    assert any(k == "account.add" and m.startswith("theory parent=physics") for k, m in kinds)

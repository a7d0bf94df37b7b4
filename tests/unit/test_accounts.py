"""The account tree: Slurm's classic fair share over root -> accounts -> sub-accounts -> users.

Every expected number is worked out by hand in the comments, with Slurm's classic definitions
(scheduler/core/accounts.py): S = product of (S_self / S_siblings) up the tree; U = raw / raw(root);
UE = U under root, else U + (UE_parent - U) * S_self / S_siblings; F = 2^(-UE / S).
"""

import random

import pytest

from scheduler.core.accounts import (
    ROOT,
    AccountView,
    fair_parts,
    max_min_split,
    share_tree,
    tree_factors,
    would_cycle,
)
from scheduler.core.fairshare import competing_tree, queue_order, user_factors
from scheduler.core.policy_config import PolicyConfig
from tests.builders import cluster, job


def rows_by_name(rows):  # type: ignore[no-untyped-def]
    return {(r.user or r.account): r for r in rows}


def test_slurm_machine_allocation_figure_ten_users_in_a3_get_one_percent_each() -> None:
    # Slurm's classic fair-share page, Figure 1: accounts A, B, C, D; A's shares split among A1..A4;
    # "If there are 10 users given equal shares in Account A3, they will each be allocated 1% of the
    # machine."  Shares here: A 40, B 30, C 20, D 10 (A = 40/100 = 0.4 of the machine); A1..A4 25 each
    # (A3 = 0.4 * 25/100 = 0.1); ten users of 1 share each in A3: 0.1 * 1/10 = 0.01.
    accounts = {a: AccountView(a, None, s) for a, s in (("A", 40), ("B", 30), ("C", 20), ("D", 10))}
    accounts |= {f"A{i}": AccountView(f"A{i}", "A", 25) for i in range(1, 5)}
    users = {f"u{i}": "A3" for i in range(10)}
    rows = rows_by_name(share_tree(accounts, users, {}, {}))
    assert rows["A"].norm_shares == pytest.approx(0.4)
    assert rows["A3"].norm_shares == pytest.approx(0.1)
    for i in range(10):
        assert rows[f"u{i}"].norm_shares == pytest.approx(0.01)
        assert rows[f"u{i}"].factor == 1.0  # nobody used anything: F = 2^0
    assert rows["B"].norm_shares == pytest.approx(0.3)


def test_a_user_who_used_nothing_inherits_part_of_a_busy_accounts_usage() -> None:
    # root -> physics (60) {alice 1, bob 1}, bio (40) {carol 1}; usage alice 600, bob 0, carol 400.
    # total 1000.  physics: S 0.6, U 0.6, UE = U = 0.6 (child of root), F = 2^(-1) = 0.5.
    # alice: S = 0.6 * 1/2 = 0.3, U 0.6, UE = 0.6 + (0.6 - 0.6) * 1/2 = 0.6, F = 2^(-2) = 0.25.
    # bob: S 0.3, U 0, UE = 0 + (0.6 - 0) * 1/2 = 0.3, F = 2^(-1) = 0.5 (not 1: his team is busy).
    # carol: S = 0.4, U 0.4, UE = 0.4 + (0.4 - 0.4) * 1 = 0.4, F = 2^(-1) = 0.5.
    accounts = {"physics": AccountView("physics", None, 60), "bio": AccountView("bio", None, 40)}
    rows = rows_by_name(share_tree(accounts, {"alice": "physics", "bob": "physics", "carol": "bio"},
                                   {"alice": 600, "carol": 400}, {}))
    assert rows["physics"].raw_usage == 600
    assert (rows["physics"].norm_shares, rows["physics"].effective_usage) == (pytest.approx(0.6), pytest.approx(0.6))
    assert rows["alice"].factor == pytest.approx(0.25)
    assert rows["bob"].effective_usage == pytest.approx(0.3)
    assert rows["bob"].factor == pytest.approx(0.5)
    assert rows["carol"].factor == pytest.approx(0.5)
    assert rows[ROOT].raw_usage == 1000


def test_usage_rolls_up_through_sub_accounts() -> None:
    # root -> ml (1) -> vision (1) {v1}, nlp (1) {n1}; root -> ops (1) {o1}.  usage v1 300, n1 100.
    # total 400.  ml: S 0.5, U 1.0, UE 1.0, F 2^-2.  ops: S 0.5, U 0, F 1.
    # vision: S 0.25, U 0.75, UE = 0.75 + (1.0 - 0.75) * 1/2 = 0.875, F = 2^(-3.5).
    # nlp: S 0.25, U 0.25, UE = 0.25 + (1.0 - 0.25) * 1/2 = 0.625, F = 2^(-2.5).
    # v1 (only user of vision): S 0.25, UE = 0.75 + (0.875 - 0.75) * 1 = 0.875, F = 2^(-3.5).
    # n1: S 0.25, UE = 0.25 + (0.625 - 0.25) * 1 = 0.625, F = 2^(-2.5).  o1: F 1.
    b = (cluster().account("ml").account("vision", "ml", users=("v1",)).account("nlp", "ml", users=("n1",))
         .account("ops", users=("o1",)).usage(v1=300, n1=100))
    snap = b.build()
    rows = share_tree(snap.accounts, snap.user_account, snap.usage, snap.shares)
    by = rows_by_name(rows)
    assert by["ml"].raw_usage == 400 and by["ml"].factor == pytest.approx(0.25)
    assert by["vision"].effective_usage == pytest.approx(0.875)
    assert by["v1"].factor == pytest.approx(2**-3.5)
    assert by["n1"].factor == pytest.approx(2**-2.5)
    assert by["o1"].factor == 1.0
    # sshare order: root, then depth first, accounts before users, by name
    assert [(r.user or r.account, r.depth) for r in rows] == [
        ("root", 0), ("ml", 1), ("nlp", 2), ("n1", 3), ("vision", 2), ("v1", 3), ("ops", 1), ("o1", 2)]
    # and the queue follows the tree: o1 (F 1) before n1 (2^-2.5) before v1 (2^-3.5)
    snap = b.pending(job(1, user="v1"), job(2, user="n1"), job(3, user="o1")).build()
    ordered, _, factors = queue_order(snap, PolicyConfig())
    assert [j.id for j in ordered] == [3, 2, 1]
    assert factors[1] == pytest.approx(2**-3.5)


def test_no_accounts_is_the_flat_factor_number_for_number() -> None:
    rng = random.Random(7)
    for _ in range(50):
        users = [f"u{i}" for i in range(rng.randint(1, 6))]
        usage = {u: rng.choice([0.0, rng.uniform(0, 1000)]) for u in users}
        shares = {u: rng.choice([1.0, 2.0, 5.0]) for u in users if rng.random() < 0.7}
        flat = user_factors(usage, shares, users)
        tree = tree_factors({}, {}, usage, shares, users)
        assert tree == pytest.approx(flat)


def test_unknown_accounts_and_cycles_hang_under_root() -> None:
    # a user in an account nobody made, and a -> b -> a: all under root, nothing lost or looping
    accounts = {"a": AccountView("a", "b"), "b": AccountView("b", "a"), "c": AccountView("c", "gone")}
    rows = share_tree(accounts, {"x": "nowhere", "y": "a"}, {"x": 10, "y": 10}, {})
    names = [r.user or r.account for r in rows]
    assert sorted(names) == sorted(["root", "a", "b", "c", "x", "y"])
    by = rows_by_name(rows)
    assert by["x"].depth == 1 and by["c"].depth == 1
    assert by[ROOT].raw_usage == 20


def test_zero_shares_with_usage_gets_zero() -> None:
    f = tree_factors({"t": AccountView("t", None, 1)}, {"a": "t", "b": "t"}, {"a": 5, "b": 5}, {"a": 0, "b": 1})
    assert f["a"] == 0.0
    assert 0 < f["b"] < 1


def test_would_cycle() -> None:
    accounts = {"a": AccountView("a"), "b": AccountView("b", "a"), "c": AccountView("c", "b")}
    assert would_cycle(accounts, "a", "c")  # a under c under b under a
    assert would_cycle(accounts, "a", "a")
    assert not would_cycle(accounts, "c", "a")
    assert not would_cycle(accounts, "d", None)


def test_competing_tree_leaves_out_users_without_jobs_and_accounts_above_none_of_them() -> None:
    # root -> phys (1) -> hep (1) -> p2; phys -> p1; chem (1) -> c1; bio (2) -> b1.  b1 has usage 60 but
    # no jobs now; p1 used 30, c1 10, p2 0.  Competing: p1, c1, p2 (bio is left out: root's children
    # are phys and chem, 1 share each).
    snap = (cluster().account("phys", users=("p1",)).account("hep", parent="phys", users=("p2",))
            .account("chem", users=("c1",)).account("bio", shares=2, users=("b1",))
            .usage(p1=30, c1=10, b1=60, p2=0).build())
    factors, shares = competing_tree(snap, ["p1", "c1", "p2"])
    assert set(factors) == set(shares) == {"p1", "c1", "p2"}
    # S: chem 1/2, c1 alone in chem 1/2; phys 1/2, its children hep and p1 1 share each: p1 1/4, hep 1/4,
    # p2 alone in hep 1/4
    assert shares == pytest.approx({"c1": 0.5, "p1": 0.25, "p2": 0.25})
    # U over 40: phys 0.75 (UE 0.75 under root), chem 0.25.  c1: UE = 0.25 + (0.25 - 0.25) * 1 = 0.25,
    # F = 2^(-0.25 / 0.5) = 0.7071.  p1: U 0.75, UE = 0.75 + (0.75 - 0.75) / 2 = 0.75, F = 2^(-3) = 0.125.
    # hep: U 0, UE = 0 + (0.75 - 0) / 2 = 0.375; p2 alone in hep: UE = 0.375, F = 2^(-0.375 / 0.25) = 2^(-1.5)
    assert factors == pytest.approx({"c1": 2 ** -0.5, "p1": 0.125, "p2": 2 ** -1.5})
    # Over the whole tree c1 is over its share: S = 1/4 (bio holds 2 of root's 4 shares), U = 0.1,
    # F = 2^(-0.4) = 0.758 here, but with b1's usage gone from the total it is 2^(-0.5) above
    whole = tree_factors(snap.accounts, snap.user_account, snap.usage, snap.shares)
    assert whole["c1"] == pytest.approx(2 ** -0.4)


def test_competing_tree_without_accounts_is_the_flat_factor_over_those_users() -> None:
    # a used 60, b 40, c (1 share, no usage) has no jobs.  Over all three S = 1/3: b's F = 2^(-0.4 / (1/3))
    # = 2^(-1.2) = 0.435, over its share.  Among a and b, S = 1/2: b 2^(-0.8) = 0.574, a 2^(-1.2) = 0.435.
    snap = cluster().usage(a=60, b=40).shares(c=1).build()
    assert user_factors(snap.usage, snap.shares)["b"] == pytest.approx(2 ** -1.2)
    factors, shares = competing_tree(snap, ["a", "b"])
    assert factors == pytest.approx({"a": 2 ** -1.2, "b": 2 ** -0.8})
    assert shares == pytest.approx({"a": 0.5, "b": 0.5})


def test_fair_parts_split_each_level_among_the_children_that_ask() -> None:
    # 12 devices.  root -> physics (2 shares: alice 1, bob 1), bio (1: carol 1), chem (5: dave, asks
    # nothing).  Demand: alice 10, bob 1, carol 8; eve (0 shares, under root) 3.
    # root: chem and eve take no part (nothing asked / no weight); physics asks 11, bio 8, weights 2 : 1.
    # Water-filling in order of asked / weight: physics (11 / 2 = 5.5) first: min(11, 12 * 2/3) = 8;
    # then bio: min(8, 12 - 8) = 4.  physics' 8: bob (1 / 1) first: min(1, 8 / 2) = 1; alice min(10, 7) = 7.
    accounts = {"physics": AccountView("physics", None, 2), "bio": AccountView("bio", None, 1),
                "chem": AccountView("chem", None, 5)}
    users = {"alice": "physics", "bob": "physics", "carol": "bio", "dave": "chem"}
    demand = {"alice": 10.0, "bob": 1.0, "carol": 8.0, "dave": 0.0, "eve": 3.0}
    parts = fair_parts(accounts, users, {"eve": 0.0}, demand, 12.0)
    assert parts == pytest.approx({"alice": 7.0, "bob": 1.0, "carol": 4.0, "dave": 0.0, "eve": 0.0})
    # with more devices than asked everyone with shares gets what they ask; eve, with no shares, gets no
    # part at all (as a KAI queue with over-quota weight 0): the rest is left over
    parts = fair_parts(accounts, users, {"eve": 0.0}, demand, 100.0)
    assert parts == pytest.approx({"alice": 10.0, "bob": 1.0, "carol": 8.0, "dave": 0.0, "eve": 0.0})


def test_fair_parts_without_accounts_are_the_flat_weighted_max_min_split() -> None:
    # 10 devices, shares 1 / 1 / 3, demand 1 / 6 / 9: u1 first (1 / 1): 1; then u3 (9 / 3 = 3) before
    # u2 (6): min(9, 9 * 3/4) = 6.75; u2 min(6, 2.25) = 2.25.
    demand = {"u1": 1.0, "u2": 6.0, "u3": 9.0}
    shares = {"u1": 1.0, "u2": 1.0, "u3": 3.0}
    assert fair_parts({}, {}, shares, demand, 10.0) == pytest.approx({"u1": 1.0, "u2": 2.25, "u3": 6.75})
    assert max_min_split(demand, 10.0, shares) == pytest.approx({"u1": 1.0, "u2": 2.25, "u3": 6.75})

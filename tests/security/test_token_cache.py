"""The gate's cache of who tokens are (``scheduler.server.app.Identities``): hits cost no lookup."""

from __future__ import annotations

import asyncio

from scheduler.server.app import Identities
from scheduler.server.auth import Identity

ALICE = Identity("user", "alice")
NODE = Identity("agent", "alice")  # an agent of a node that happens to be called like a user


class Lookups:
    def __init__(self) -> None:
        self.tokens = {"a": ALICE, "n": NODE}
        self.calls: list[str] = []

    def __call__(self, token: str) -> Identity | None:
        self.calls.append(token)
        return self.tokens.get(token)


def test_known_tokens_are_looked_up_once_per_ttl() -> None:
    now = [100.0]
    lookups = Lookups()
    ids = Identities(lookups, ttl=5.0, clock=lambda: now[0])

    async def run() -> None:
        assert await ids("a") == ALICE and await ids("a") == ALICE
        assert lookups.calls == ["a"]
        now[0] += 6  # past the TTL: looked up again
        assert await ids("a") == ALICE and lookups.calls == ["a", "a"]
        assert await ids("nope") is None and await ids("nope") is None  # refusals are not kept
        assert lookups.calls == ["a", "a", "nope", "nope"]

    asyncio.run(run())


def test_forget_drops_the_users_token_and_not_an_agents() -> None:
    lookups = Lookups()
    ids = Identities(lookups, ttl=60.0)

    async def run() -> None:
        await ids("a")
        await ids("n")
        ids.forget("alice")
        del lookups.tokens["a"]
        assert await ids("a") is None  # looked up again, and gone
        assert await ids("n") == NODE
        assert lookups.calls == ["a", "n", "a"]

    asyncio.run(run())


def test_a_lookup_under_way_when_a_user_is_removed_is_not_kept() -> None:
    lookups = Lookups()
    ids: Identities

    def slow(token: str) -> Identity | None:
        me = lookups(token)
        ids.forget("alice")  # removed while this lookup was reading the old row
        return me

    ids = Identities(slow, ttl=60.0)

    async def run() -> None:
        assert await ids("a") == ALICE
        await ids("a")
        assert lookups.calls == ["a", "a"]

    asyncio.run(run())


def test_an_agents_token_is_kept_longer_than_a_heartbeat_period_and_a_users_is_not() -> None:
    now = [100.0]
    lookups = Lookups()
    ids = Identities(lookups, ttl=5.0, clock=lambda: now[0], agent_ttl=300.0)

    async def run() -> None:
        assert await ids("n") == NODE and await ids("a") == ALICE
        now[0] += 6  # one heartbeat period later: the agent's is still known, the user's looked up again
        assert await ids("n") == NODE and await ids("a") == ALICE
        assert lookups.calls == ["n", "a", "a"]
        now[0] += 300
        assert await ids("n") == NODE and lookups.calls == ["n", "a", "a", "n"]

    asyncio.run(run())

"""Tokens and identities.

Three kinds of credential, each with its own prefix so a token can never be mistaken for another kind:
``gsu_`` users (role ``user`` or ``admin``), ``gsa_`` agents (bound to one node name).  Only SHA-256
hashes are stored; tokens are 32 random bytes, so a plain hash is enough and lookup is by hash.
Agents prove themselves to each other with HMAC tickets made from the cluster's peer key, which the
server hands to authenticated agents only (scheduler/protocol/tickets.py, shared with the agents).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

USER_PREFIX = "gsu_"
AGENT_PREFIX = "gsa_"


@dataclass(frozen=True)
class Identity:
    kind: str  # "user" | "admin" | "agent"
    name: str  # user name, or node name for agents

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"

    @property
    def is_agent(self) -> bool:
        return self.kind == "agent"

    @property
    def actor(self) -> str:
        return f"agent:{self.name}" if self.is_agent else self.name


def new_token(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())

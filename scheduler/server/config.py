"""Server configuration: one TOML file (``gsched.toml`` or ``--config``), then ``GSCHED_*`` variables.

Example::

    db = "sqlite:////var/lib/gsched/gsched.db"     # or postgresql+psycopg://user@host/gsched
    host = "127.0.0.1"
    port = 8470
    cycle_interval_s = 2.0
    heartbeat_ttl_s = 15.0
    tls_cert = "/etc/gsched/server.pem"            # HTTPS (both or neither; see docs/security.md)
    tls_key = "/etc/gsched/server.key"
    run_as_agent_user = false                      # true: single-team mode, jobs run as the agents' account
    disk_floor_gb = 5                              # a node with less free disk takes no new ranks or copies
    node_cache_gb = 0                              # staged copies kept on a node (most recently read first)

    [policy]
    arbiter = "twostage"
    locality_wait_s = 10
    usage_half_life_s = 604800

    [network]
    same_rack_gbps = 25
    cross_rack_gbps = 10

    [users]            # created on first start with these shares; tokens printed once
    alice = 1
    bob = 1

Environment overrides: GSCHED_DB, GSCHED_HOST, GSCHED_PORT, GSCHED_CYCLE_INTERVAL_S,
GSCHED_HEARTBEAT_TTL_S, GSCHED_TLS_CERT, GSCHED_TLS_KEY, GSCHED_ARBITER, GSCHED_LOCALITY_WAIT_S,
GSCHED_HEADER_TIMEOUT_S, GSCHED_MAX_CONNECTIONS, GSCHED_MAX_CONNECTIONS_PER_CLIENT, GSCHED_METRICS_TOKEN,
GSCHED_RUN_AS_AGENT_USER (1/true/yes/on), GSCHED_DISK_FLOOR_GB, GSCHED_NODE_CACHE_GB.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from scheduler.core.diskfloor import floor_bytes
from scheduler.core.policy_config import PolicyConfig
from scheduler.server.config_schema import ConfigFile


def gsched_home() -> Path:
    return Path(os.environ.get("GSCHED_HOME", "~/.gsched")).expanduser()


@dataclass(frozen=True)
class Settings:
    db: str = ""
    host: str = "127.0.0.1"
    port: int = 8470
    cycle_interval_s: float = 2.0
    heartbeat_ttl_s: float = 15.0
    heartbeat_s: float = 2.0  # how often agents are asked to report
    lease_ttl_s: float = 6.0  # a standby server takes over this long after the leader stops renewing
    replication_concurrency: int = 2  # re-replication transfers in flight, cluster-wide
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    users: dict[str, float] = field(default_factory=dict)
    home: Path = field(default_factory=gsched_home)
    tls_cert: str = ""  # PEM certificate chain; with tls_key, the API is served over HTTPS
    tls_key: str = ""
    peer_ca: str = ""  # the CA that signed the agents' data-server certificates: verifies them for nudges
    header_timeout_s: float = 10.0  # a connection whose request headers take longer is closed
    max_connections: int = 2048  # connections open at once; a new one beyond is closed at once
    max_connections_per_client: int = 256  # the same, from one client address
    metrics_token: str = ""  # when set, GET /metrics needs "Authorization: Bearer <metrics_token>"
    # Single-team mode: every [run] job runs as the agents' own account, whatever its user (no
    # `gsched user ... --unix-user` mapping needed).  False: a [run] job needs its user's mapping.
    run_as_agent_user: bool = False
    # Who may submit a job with [limits] preemptible = false (never a victim of preemption): admins
    # always; these users too ("*": every user).
    non_preemptible_users: list[str] = field(default_factory=list)
    # A node whose agent reports less free disk than this takes no new ranks or shard copies
    # (scheduler/core/diskfloor.py); 0: no floor.
    disk_floor_gb: float = 5.0
    # The node cache: copies no layout needs any more (a shard a rank staged where it ran, the old place
    # of a copy moved) kept on each node up to this many GB, the least recently read dropped first
    # (scheduler/server/replication.py); 0: dropped once no job reads them.
    node_cache_gb: float = 0.0

    @property
    def disk_floor_bytes(self) -> int:
        return floor_bytes(self.disk_floor_gb)

    @property
    def node_cache_bytes(self) -> int:
        return floor_bytes(self.node_cache_gb)

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"

    @property
    def db_url(self) -> str:
        return self.db or f"sqlite:///{self.home / 'gsched.db'}"


class ConfigError(ValueError):
    pass


_ENV = {  # variable -> (key, or "policy.key")
    "GSCHED_DB": "db",
    "GSCHED_HOST": "host",
    "GSCHED_PORT": "port",
    "GSCHED_CYCLE_INTERVAL_S": "cycle_interval_s",
    "GSCHED_HEARTBEAT_TTL_S": "heartbeat_ttl_s",
    "GSCHED_HEARTBEAT_S": "heartbeat_s",
    "GSCHED_TLS_CERT": "tls_cert",
    "GSCHED_TLS_KEY": "tls_key",
    "GSCHED_PEER_CA": "peer_ca",
    "GSCHED_LEASE_TTL_S": "lease_ttl_s",
    "GSCHED_HEADER_TIMEOUT_S": "header_timeout_s",
    "GSCHED_MAX_CONNECTIONS": "max_connections",
    "GSCHED_MAX_CONNECTIONS_PER_CLIENT": "max_connections_per_client",
    "GSCHED_METRICS_TOKEN": "metrics_token",
    "GSCHED_RUN_AS_AGENT_USER": "run_as_agent_user",
    "GSCHED_DISK_FLOOR_GB": "disk_floor_gb",
    "GSCHED_NODE_CACHE_GB": "node_cache_gb",
    "GSCHED_ARBITER": "policy.arbiter",
    "GSCHED_LOCALITY_WAIT_S": "policy.locality_wait_s",
}


def _checked(doc: dict[str, Any], source: str, strict: bool, names: dict[str, str] | None = None) -> ConfigFile:
    """``doc`` validated as ``ConfigFile``; ``ConfigError`` naming ``source`` and each bad key (as
    ``names`` calls it: the environment variable for a key that came from one)."""
    try:
        return ConfigFile.model_validate(doc, strict=strict)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            key = (names or {}).get(key, key)
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                top = key.split(".")[0]
                table = ConfigFile if top == key else ConfigFile.model_fields[top].annotation
                known = sorted(getattr(table, "model_fields", {}))
                msg = f"unknown key (known: {', '.join(known)})"
            problems.append(f"{key}: {msg}")
        raise ConfigError(f"{source}: " + "; ".join(problems)) from None


def _given(model: ConfigFile) -> tuple[dict[str, Any], dict[str, Any]]:
    """The top-level and the policy settings ``model`` sets, as ``Settings`` and ``PolicyConfig`` keys."""
    top = model.model_dump(exclude_unset=True, exclude={"policy", "network"})
    policy = model.policy.model_dump(exclude_unset=True)
    network = model.network.model_dump(exclude_unset=True)
    for key, gbps in network.items():
        policy[key.replace("_gbps", "_bps")] = gbps * 1e9 / 8
    return top, policy


def load_settings(path: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Read the config file (if any), apply ``GSCHED_*`` variables, then explicit overrides (flags).

    Each source is validated with ``config_schema.ConfigFile``; raises ``ConfigError`` naming the file
    (or variable, or flag) and the key for anything wrong: an unknown key, a wrong type, a value out
    of range.
    """
    data: dict[str, Any] = {}
    source = "defaults"
    if path is None and Path("gsched.toml").exists():
        path = "gsched.toml"
    if path is not None:
        source = str(path)
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as e:
            raise ConfigError(f"config file {path} not found") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: {e}") from e
    kwargs, policy_kwargs = _given(_checked(data, source, strict=True))
    env_doc: dict[str, Any] = {}
    for var, key in _ENV.items():
        if var in os.environ:
            table, _, name = key.rpartition(".")
            (env_doc.setdefault(table, {}) if table else env_doc)[name] = os.environ[var]
    env_top, env_policy = _given(_checked(env_doc, "environment", strict=False, names={v: k for k, v in _ENV.items()}))
    flags = {k: v for k, v in overrides.items() if v is not None}
    flag_top, _ = _given(_checked(flags, "command line", strict=False))
    kwargs.update(env_top, **flag_top)
    policy_kwargs.update(env_policy)
    settings = Settings(**kwargs)
    settings = replace(settings, policy=replace(settings.policy, **policy_kwargs))
    _check_tls(settings)
    return settings


def policy_with(values: Mapping[str, str], source: str) -> PolicyConfig:
    """``PolicyConfig``'s defaults with ``values`` (``[policy]`` key -> text, as a command line gives
    them) over them, checked as the environment is: durations as text (``"30m"``), every key's type and
    range; ``ConfigError`` names ``source`` and each bad key."""
    _, policy = _given(_checked({"policy": dict(values)}, source, strict=False))
    return replace(PolicyConfig(), **policy)


def _check_tls(settings: Settings) -> None:
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise ConfigError("HTTPS needs both tls_cert and tls_key (--tls-cert FILE --tls-key FILE)")
    for what, path in (("tls_cert", settings.tls_cert), ("tls_key", settings.tls_key), ("peer_ca", settings.peer_ca)):
        if path and not Path(path).is_file():
            raise ConfigError(f"{what}: {path} is not a readable file")
    if settings.peer_ca:  # loaded here, so that a bad one stops the start rather than the cycle process
        import ssl

        try:
            ssl.create_default_context(cafile=settings.peer_ca)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"peer_ca: {settings.peer_ca} holds no PEM CA certificate ({e})") from None

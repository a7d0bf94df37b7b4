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
GSCHED_HEADER_TIMEOUT_S, GSCHED_MAX_CONNECTIONS, GSCHED_MAX_CONNECTIONS_PER_CLIENT, GSCHED_RUN_AS_AGENT_USER
(1/true/yes/on).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from scheduler.core.policy_config import PolicyConfig


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
    header_timeout_s: float = 10.0  # a connection whose request headers take longer is closed
    max_connections: int = 2048  # connections open at once; a new one beyond is closed at once
    max_connections_per_client: int = 256  # the same, from one client address
    # Single-team mode: every [run] job runs as the agents' own account, whatever its user (no
    # `gsched user ... --unix-user` mapping needed).  False: a [run] job needs its user's mapping.
    run_as_agent_user: bool = False

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"

    @property
    def db_url(self) -> str:
        return self.db or f"sqlite:///{self.home / 'gsched.db'}"


class ConfigError(ValueError):
    pass


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


_ENV: dict[str, tuple[str, Callable[[str], Any]]] = {
    "GSCHED_DB": ("db", str),
    "GSCHED_HOST": ("host", str),
    "GSCHED_PORT": ("port", int),
    "GSCHED_CYCLE_INTERVAL_S": ("cycle_interval_s", float),
    "GSCHED_HEARTBEAT_TTL_S": ("heartbeat_ttl_s", float),
    "GSCHED_HEARTBEAT_S": ("heartbeat_s", float),
    "GSCHED_TLS_CERT": ("tls_cert", str),
    "GSCHED_TLS_KEY": ("tls_key", str),
    "GSCHED_LEASE_TTL_S": ("lease_ttl_s", float),
    "GSCHED_HEADER_TIMEOUT_S": ("header_timeout_s", float),
    "GSCHED_MAX_CONNECTIONS": ("max_connections", int),
    "GSCHED_MAX_CONNECTIONS_PER_CLIENT": ("max_connections_per_client", int),
    "GSCHED_RUN_AS_AGENT_USER": ("run_as_agent_user", _flag),
}
_POLICY_ENV = {
    "GSCHED_ARBITER": ("arbiter", str),
    "GSCHED_LOCALITY_WAIT_S": ("locality_wait_s", float),
}


def load_settings(path: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Read the config file (if any), apply ``GSCHED_*`` variables, then explicit overrides.

    Raises ``ConfigError`` naming the file and key for anything it does not understand.
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
    top = {f.name for f in fields(Settings)} - {"policy", "users", "home"}
    kwargs: dict[str, Any] = {}
    policy_kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key in top:
            kwargs[key] = value
        elif key == "policy":
            known = {f.name for f in fields(PolicyConfig)}
            for k, v in _table(value, source, key).items():
                if k not in known:
                    raise ConfigError(f"{source}: unknown key policy.{k} (known: {', '.join(sorted(known))})")
                policy_kwargs[k] = v
        elif key == "network":
            for k, v in _table(value, source, key).items():
                if k == "same_rack_gbps":
                    policy_kwargs["same_rack_bps"] = float(v) * 1e9 / 8
                elif k == "cross_rack_gbps":
                    policy_kwargs["cross_rack_bps"] = float(v) * 1e9 / 8
                else:
                    raise ConfigError(f"{source}: unknown key network.{k} (same_rack_gbps, cross_rack_gbps)")
        elif key == "users":
            kwargs["users"] = {str(k): float(v) for k, v in _table(value, source, key).items()}
        else:
            raise ConfigError(f"{source}: unknown key {key!r} (known: {', '.join(sorted(top))}, policy, network, users)")
    for var, (name, conv) in _ENV.items():
        if var in os.environ:
            kwargs[name] = conv(os.environ[var])
    for var, (name, conv) in _POLICY_ENV.items():
        if var in os.environ:
            policy_kwargs[name] = conv(os.environ[var])
    for k, v in overrides.items():
        if v is not None:
            kwargs[k] = v
    try:
        settings = Settings(**kwargs)
        settings = replace(settings, policy=replace(settings.policy, **policy_kwargs))
    except TypeError as e:
        raise ConfigError(f"{source}: {e}") from e
    _check_tls(settings)
    _check_connections(settings, source)
    if not isinstance(settings.run_as_agent_user, bool):
        raise ConfigError(f"{source}: run_as_agent_user must be true or false")
    return settings


def _check_connections(settings: Settings, source: str) -> None:
    if not settings.header_timeout_s > 0:
        raise ConfigError(f"{source}: header_timeout_s must be more than 0 seconds")
    for key in ("max_connections", "max_connections_per_client"):
        if getattr(settings, key) < 1:
            raise ConfigError(f"{source}: {key} must be at least 1")


def _check_tls(settings: Settings) -> None:
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise ConfigError("HTTPS needs both tls_cert and tls_key (--tls-cert FILE --tls-key FILE)")
    for what, path in (("tls_cert", settings.tls_cert), ("tls_key", settings.tls_key)):
        if path and not Path(path).is_file():
            raise ConfigError(f"{what}: {path} is not a readable file")


def _table(value: Any, source: str, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: [{key}] must be a table")
    return value

"""The schema of the server's config (gsched.toml, ``GSCHED_*`` variables, ``gsched server`` flags),
checked with pydantic: every key has a type and a range, and an unknown key is refused.

``scheduler.server.config.load_settings`` validates each source with ``ConfigFile``: the TOML file
strictly (``port = "8470"`` is refused: TOML has integers), the environment and flags leniently (they
are text).  Keys ending in ``_s`` are durations (``scheduler.core.durations``): a number of seconds,
or text such as ``"30m"``, ``"2h30m"`` or ``"1-00:00:00"``.  ``PolicyTable`` must have the fields of
``PolicyConfig`` (a unit test checks), so a new policy knob cannot be left out of the file.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from scheduler.core.durations import parse_duration


def _seconds(value: Any) -> Any:
    """A duration given as text becomes seconds (``"0.5"`` from the environment too); a number passes
    on to be checked as one."""
    if not isinstance(value, str):
        return value
    if re.fullmatch(r"\s*\d{1,12}\.\d{1,9}\s*", value):  # fractions of a second: only as plain seconds
        return float(value)
    return float(parse_duration(value))


Seconds = Annotated[float, BeforeValidator(_seconds), Field(ge=0)]
PositiveSeconds = Annotated[float, BeforeValidator(_seconds), Field(gt=0)]


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class PolicyTable(_Table):
    """``[policy]``: the fields of ``PolicyConfig`` (docs/config.md says what each does)."""

    arbiter: str | None = None
    candidates_per_job: int | None = Field(None, ge=1, le=1000)
    same_rack_bps: float | None = Field(None, gt=0)
    cross_rack_bps: float | None = Field(None, gt=0)
    usage_half_life_s: PositiveSeconds | None = None
    fairshare_weight: float | None = Field(None, ge=0)
    age_weight: float | None = Field(None, ge=0)
    age_max_s: PositiveSeconds | None = None
    locality_wait_s: Seconds | None = None
    locality_threshold_ms: int | None = Field(None, ge=0)
    tie_window_s: Seconds | None = None
    tie_fairshare: float | None = Field(None, ge=0, le=1)
    tie_shortest_first: bool | None = None
    stage_penalty: float | None = Field(None, ge=0, le=1)
    reserve_min_wait_s: Seconds | None = None
    max_wait_s: Seconds | None = None
    cost_weight: float | None = Field(None, ge=0)
    shortest_first: bool | None = None
    preempt: bool | None = None
    preempt_after_s: Seconds | None = None
    min_runtime_s: Seconds | None = None
    min_runtime_backoff: float | None = Field(None, ge=1, le=1000)
    preempt_max_per_hour: int | None = Field(None, ge=0, le=1000)
    preempt_locality_wait_s: Seconds | None = None
    preempt_equal_loss_s: Seconds | None = None
    preempt_data_wait_s: Seconds | None = None
    preempt_wide_window_s: Seconds | None = None


class NetworkTable(_Table):
    """``[network]``: the bandwidth assumed by distance, in Gb/s."""

    same_rack_gbps: float | None = Field(None, gt=0)
    cross_rack_gbps: float | None = Field(None, gt=0)


class ConfigFile(_Table):
    """The whole config; a key left out keeps ``Settings``' default."""

    db: str | None = None
    host: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    cycle_interval_s: PositiveSeconds | None = None
    heartbeat_ttl_s: PositiveSeconds | None = None
    heartbeat_s: PositiveSeconds | None = None
    lease_ttl_s: PositiveSeconds | None = None
    replication_concurrency: int | None = Field(None, ge=1, le=1000)
    tls_cert: str | None = None
    tls_key: str | None = None
    peer_ca: str | None = None
    header_timeout_s: PositiveSeconds | None = None
    max_connections: int | None = Field(None, ge=1)
    max_connections_per_client: int | None = Field(None, ge=1)
    metrics_token: str | None = Field(None, min_length=16, max_length=256)
    run_as_agent_user: bool | None = None
    non_preemptible_users: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = None
    disk_floor_gb: float | None = Field(None, ge=0, le=1_000_000)
    node_cache_gb: float | None = Field(None, ge=0, le=1_000_000)
    policy: PolicyTable = PolicyTable()
    network: NetworkTable = NetworkTable()
    users: dict[Annotated[str, Field(min_length=1, max_length=64)], Annotated[float, Field(ge=0)]] = {}

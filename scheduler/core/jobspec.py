"""job.toml: the schema of a training job, validated with pydantic (every error names its field).

Example::

    name = "resnet-digits"

    [resources]
    ranks = 2            # DDP processes (one per device group), all started together (a gang)
    gpus_per_rank = 1    # devices each rank gets on its node

    [data]
    dataset = "digits"   # a data set made with `gsched data make`

    [train]              # the built-in DDP ResNet-18 workload
    epochs = 3
    batch_size = 64      # per rank
    lr = 0.05

    [limits]
    time = "30m"         # wall-clock limit: "90s", "2h30m", "1:30:00", "1-12:00:00" or seconds
    max_restarts = 3     # requeues after node loss before the job fails

A job runs the built-in (``[train]``, the default) or the user's own command (``[run]``,
scheduler/protocol/runspec.py), never both; ``[data]`` is optional for a ``[run]`` job.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from scheduler.core.durations import parse_duration
from scheduler.protocol.rankspec import TrainKnobs
from scheduler.protocol.runspec import RunTable

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
DATASET_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
MAX_TIME_S = 30 * 24 * 3600


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Resources(_Strict):
    ranks: int = Field(1, ge=1, le=512)
    gpus_per_rank: int = Field(1, ge=1, le=16)


class Data(_Strict):
    dataset: str = Field(pattern=DATASET_PATTERN)

    @field_validator("dataset")
    @classmethod
    def _no_dots(cls, v: str) -> str:
        if ".." in v:
            raise ValueError("must not contain '..'")
        return v


class Limits(_Strict):
    time: int | str = 3600
    max_restarts: int = Field(3, ge=0, le=100)
    retry_on_failure: int = Field(0, ge=0, le=100)
    preemptible: bool = True  # false: never a victim of preemption (policies.preemption)

    @field_validator("time")
    @classmethod
    def _parse_time(cls, v: int | str) -> int:
        seconds = parse_duration(v)
        if not 1 <= seconds <= MAX_TIME_S:
            raise ValueError(f"must be between 1 second and {MAX_TIME_S // 86400} days")
        return seconds


BOTH = "a job has [run] (your own command) or [train] (the built-in ResNet-18), never both: remove one"
NO_DATA = "required key is missing ([data] may be left out only by a [run] job)"


class JobSpec(_Strict):
    """A validated job.toml.  Exactly one of ``train`` (the built-in, the default when neither is
    given) and ``run`` (the user's command) is set; ``data`` is None only for a ``run`` job."""

    name: str = Field(pattern=NAME_PATTERN)
    resources: Resources = Resources()
    data: Data | None = None
    train: TrainKnobs | None = None
    run: RunTable | None = None
    limits: Limits = Limits()

    @model_validator(mode="after")
    def _one_workload(self) -> JobSpec:
        if self.run is not None and self.train is not None:
            raise ValueError(BOTH)
        if self.run is None:
            if self.data is None:
                raise ValueError("data: " + NO_DATA)
            if self.train is None:
                self.train = TrainKnobs()
        return self

    @property
    def time_limit_s(self) -> int:
        return int(self.limits.time)

    @property
    def dataset(self) -> str | None:
        """The data set the job reads (None: a ``[run]`` job without ``[data]``)."""
        return self.data.dataset if self.data is not None else None

    @property
    def knobs(self) -> TrainKnobs:
        """The ``[train]`` knobs of a built-in job (defaults for a ``[run]`` job, which has none)."""
        return self.train if self.train is not None else TrainKnobs()


def stored(doc: dict[str, Any]) -> JobSpec:
    """A job's stored spec (``Job.spec``, written by ``model_dump`` at submit) read back as a ``JobSpec``,
    so every reader gets the same defaults (those above), also for keys an older version did not store."""
    return JobSpec.model_validate(doc)


class JobSpecError(ValueError):
    """A job spec was refused; ``errors`` holds one "field: message" line per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


def validate_spec(data: Any) -> JobSpec:
    """Validate a parsed job.toml; raises ``JobSpecError`` with one message per bad field."""
    if not isinstance(data, dict):
        raise JobSpecError(["job spec must be a table"])
    # The two rules across tables, named by the table at fault (a model-wide check has no field).
    first: list[str] = []
    if "run" in data and "train" in data:
        first.append(f"train: {BOTH}")
    elif "run" not in data and "data" not in data:
        first.append(f"data: {NO_DATA}")
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as e:
        found = [_describe(err) for err in e.errors() if err.get("loc") or not first]
        raise JobSpecError(first + [m for m in found if m not in first]) from None
    if first:
        raise JobSpecError(first)
    return spec


def _describe(err: Any) -> str:
    where = ".".join(str(p) for p in err.get("loc", ())) or "job"
    kind = err.get("type", "")
    msg = err.get("msg", "invalid")
    if kind == "extra_forbidden":
        msg = "unknown key (check the spelling; see the job.toml reference)"
    elif kind == "missing":
        msg = "required key is missing"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return f"{where}: {msg}"

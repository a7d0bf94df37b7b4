"""The ``[run]`` table of a job.toml: the user's own command, the one definition for both ends.

scheduler/core/jobspec.py validates the job file with ``RunTable``; the server sends it as stored in
each ``Assignment`` (scheduler/protocol/messages.py) and agents/launcher.py starts it, one process per
rank, with the environment named in ``RESERVED_ENV`` (what torchrun sets, and gsched's own names):
those a job's ``env`` may not set.

Part of the protocol between the server and the agents: it imports nothing else of ``scheduler``.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

# torchrun's environment for a rank (as torch.distributed.run sets it), then the device and thread
# variables the agent sets: a job's [run.env] may set none of these.
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "OMP_NUM_THREADS")
GSCHED_PREFIX = "GSCHED_"  # every GSCHED_* name is gsched's (GSCHED_JOB_ID, GSCHED_SHARD_LIST, ...)
RESERVED_ENV = frozenset(TORCHRUN_ENV)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_ARGS = 1024
MAX_ARG_CHARS = 8192
MAX_ENV = 256
MAX_GRACE_S = 3600


def reserved(name: str) -> bool:
    """Whether gsched sets ``name`` for every rank (a job's env may not)."""
    return name in RESERVED_ENV or name.startswith(GSCHED_PREFIX)


class RunTable(BaseModel):
    """``[run]``: ``command`` (a list: the program and its arguments, run as they are; or one string,
    run by ``/bin/sh -c``), ``workdir`` (absolute, on the node; "" means the rank's own directory),
    ``env`` (added to the rank's environment) and ``grace_s`` (SIGTERM, then SIGKILL this long after)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    command: list[str] | str
    workdir: str = Field("", max_length=4096)
    env: dict[str, str] = Field(default_factory=dict)
    grace_s: float = Field(30.0, ge=0, le=MAX_GRACE_S)

    @field_validator("command", mode="before")
    @classmethod
    def _command_type(cls, v: Any) -> Any:
        if isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            return v
        raise ValueError("must be a list of strings (the program and its arguments) or one string (run by /bin/sh -c)")

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, str):
            if not v.strip():
                raise ValueError("must not be empty: give the program to run, e.g. [\"python\", \"train.py\"]")
            if len(v) > MAX_ARG_CHARS * 8 or "\x00" in v:
                raise ValueError(f"must be at most {MAX_ARG_CHARS * 8} characters, without NUL")
            return v
        if not v or not v[0].strip():
            raise ValueError("must not be empty: its first item is the program to run, e.g. [\"python\", \"train.py\"]")
        if len(v) > MAX_ARGS:
            raise ValueError(f"at most {MAX_ARGS} items")
        for i, arg in enumerate(v):
            if len(arg) > MAX_ARG_CHARS or "\x00" in arg:
                raise ValueError(f"item {i} must be at most {MAX_ARG_CHARS} characters, without NUL")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str) -> str:
        if v and not v.startswith("/"):
            raise ValueError(f"must be an absolute path (starting with /), not {v!r}")
        if "\x00" in v:
            raise ValueError("must not contain NUL")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_ENV:
            raise ValueError(f"at most {MAX_ENV} variables")
        for name, value in v.items():
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a variable name (letters, digits and _, not starting with a digit)")
            if reserved(name):
                raise ValueError(f"{name} is set by gsched for every rank and may not be set here "
                                 f"(reserved: {', '.join(TORCHRUN_ENV)} and every {GSCHED_PREFIX}* name)")
            if len(value) > MAX_ARG_CHARS or "\x00" in value:
                raise ValueError(f"{name}: the value must be at most {MAX_ARG_CHARS} characters, without NUL")
        return v

    @field_validator("grace_s", mode="before")
    @classmethod
    def _int_is_float(cls, v: Any) -> Any:
        return float(v) if isinstance(v, int) and not isinstance(v, bool) else v

    def argv(self) -> list[str]:
        """The program and its arguments: a string command runs as ``/bin/sh -c COMMAND``."""
        return ["/bin/sh", "-c", self.command] if isinstance(self.command, str) else list(self.command)

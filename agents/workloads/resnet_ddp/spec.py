"""The rank spec: the JSON file an agent writes for each rank, read with the protocol's ``RankSpec``.

Rank spec (JSON; unknown keys are refused)::

    {
      "job_id": 7,                          # int >= 1, for log lines
      "shards": ["/data/digits/00000.shard", ...],   # absolute paths this rank reads (>= 1)
      "num_classes": 10,                    # >= 2
      "checkpoint_dir": "/ckpt/job-7",      # epoch-0001.pt, epoch-0002.pt, ... (written by rank 0)
      "resume_from": null,                  # a checkpoint path, or null to start fresh
      "metrics_path": "/ckpt/job-7/metrics.jsonl",   # rank 0 appends JSON lines here
      "stop_after_epochs": null,            # optional: stop (exit 0) after this many epochs in total,
                                            # as if preempted; for tests and drills
      "train": {"epochs": 5, "batch_size": 32, "lr": 0.1, "lr_scaling": "linear", ...}
    }

``train`` is the job's ``[train]`` table: every knob, its values and its default are defined once, in
``scheduler.protocol.rankspec.TrainKnobs`` (docs/job-toml.md lists them), and the server sends a job's
whole table.  A rank spec differs in one way only: ``epochs``, ``batch_size`` and ``lr`` must be
named (a rank is not trained on figures nobody wrote down).

:func:`parse_spec` validates a parsed spec and raises :class:`SpecError`, whose message names each bad
field, for anything that cannot run.  ``SpecError`` is also what the other modules raise for a spec that
validates but cannot run on this rank's data or machine; the entry point exits 2 for it.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from scheduler.protocol.rankspec import RankSpec, TrainKnobs

NAMED = ("epochs", "batch_size", "lr")  # train knobs a rank spec must name


class SpecError(ValueError):
    """A rank spec that cannot run; the message names the field."""


def parse_spec(raw: Any) -> RankSpec:
    """Validate a rank spec dict (see the module docstring); raise SpecError naming the field(s)."""
    if not isinstance(raw, dict):
        raise SpecError("rank spec must be a JSON object")
    try:
        spec = RankSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(_describe(exc)) from None
    if "train" not in spec.model_fields_set:
        raise SpecError("rank spec is missing 'train'")
    for key in NAMED:
        if key not in spec.train.model_fields_set:
            raise SpecError(f"train.{key} is required")
    return spec


def _describe(exc: ValidationError) -> str:
    """One sentence per bad field, ``; ``-joined: unknown keys of the spec and of ``train`` gathered,
    then ``field: what it must be (got value)``."""
    unknown: dict[str, list[str]] = {}
    problems: dict[str, list[str]] = {}
    got: dict[str, Any] = {}
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        if err["type"] == "extra_forbidden":
            unknown.setdefault(".".join(loc[:-1]), []).append(loc[-1])
            continue
        where = ".".join(loc[:2] if loc[0] == "train" else loc[:1])
        if err["type"] == "missing":
            problems.setdefault(where, []).append("required")
            continue
        msg = str(err["msg"]).removeprefix("Value error, ")
        if msg not in problems.setdefault(where, []):
            problems[where].append(msg)
        got.setdefault(where, err.get("input"))
    parts = []
    for where, names in unknown.items():
        if where == "train":
            known = ", ".join(sorted(TrainKnobs.model_fields))
            parts.append(f"unknown train field(s): {', '.join(sorted(names))}; known: {known}")
        else:
            parts.append(f"unknown rank spec field(s): {', '.join(sorted(names))}")
    for where, msgs in problems.items():
        if msgs == ["required"]:
            parts.append(f"rank spec is missing {where!r}")
        else:
            parts.append(f"{where}: {' or '.join(msgs)} (got {got.get(where)!r})")
    return "; ".join(parts)

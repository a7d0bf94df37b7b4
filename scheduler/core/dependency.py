"""Job dependencies, as sbatch's ``--dependency``: ``afterok:ID[:ID...]``, ``afterany:ID``,
``afternotok:ID``, several joined by commas (all must hold).

* ``afterok``: the job may start once each named job COMPLETED; it can never start once one of them
  ended otherwise (FAILED, CANCELLED, TIMEOUT).
* ``afterany``: once each named job ended, however it ended.
* ``afternotok``: once each named job ended other than COMPLETED; never once one COMPLETED.

Pure: ``parse`` reads the text, ``verdict`` decides from the named jobs' states.  The cycle asks each
cycle for the jobs still waiting (scheduler/server/upkeep.py ``settle_dependencies``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

KINDS = ("afterok", "afterany", "afternotok")
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
MET, WAIT, NEVER = "met", "wait", "never"

Dependency = tuple[str, int]  # (kind, job id)


def parse(text: str) -> list[Dependency]:
    """``"afterok:1:2,afterany:3"`` -> ``[("afterok", 1), ("afterok", 2), ("afterany", 3)]``;
    ``ValueError`` saying what is wrong."""
    out: list[Dependency] = []
    for part in text.split(","):
        kind, _, ids = part.strip().partition(":")
        if kind not in KINDS:
            raise ValueError(f"{part.strip()!r}: the kind must be one of {', '.join(KINDS)} (as afterok:12)")
        if not ids:
            raise ValueError(f"{part.strip()!r}: name the jobs (as {kind}:12 or {kind}:12:13)")
        for word in ids.split(":"):
            if not word.isdigit() or not 1 <= int(word) <= 2**53:
                raise ValueError(f"{part.strip()!r}: {word!r} is not a job id")
            out.append((kind, int(word)))
    if not out:
        raise ValueError("is empty (as afterok:12)")
    return out


def text(deps: Sequence[Sequence[object]]) -> str:
    """The dependencies written back as ``afterok:1,afterany:3`` (one kind:id each)."""
    return ",".join(f"{kind}:{job}" for kind, job in deps)


def verdict(deps: Sequence[Sequence[object]], states: Mapping[int, str]) -> tuple[str, str]:
    """``(MET | WAIT | NEVER, words)`` for ``deps`` given the named jobs' ``states`` (a job missing
    from ``states`` is gone: that dependency can never hold).  NEVER wins over WAIT."""
    waiting = []
    for kind, job in deps:
        job_id = int(str(job))
        state = states.get(job_id)
        if state is None:
            return NEVER, f"dependency {kind}:{job_id} can never be satisfied: job {job_id} is gone"
        if state not in FINAL_STATES:
            waiting.append(f"{kind}:{job_id}")
            continue
        ok = {"afterok": state == "COMPLETED", "afterany": True, "afternotok": state != "COMPLETED"}[str(kind)]
        if not ok:
            return NEVER, f"dependency {kind}:{job_id} can never be satisfied: job {job_id} ended {state}"
    if waiting:
        return WAIT, f"waiting for dependency {','.join(waiting)}"
    return MET, "dependencies met"

"""Job arrays, as sbatch's ``--array``: one job per index, ``0-9``, ``1,3,5-7``, and ``%N`` to let at most
N of them hold devices at once (``0-99%4``).

Pure: ``parse`` reads the text.  The server makes the jobs (scheduler/server/service.py ``submit_job``),
the snapshot lets at most N of an array's jobs be active (scheduler/store/snapshot_reader.py), and each
rank's assignment carries ``GSCHED_ARRAY_JOB_ID``, ``GSCHED_ARRAY_INDEX`` and ``GSCHED_ARRAY_COUNT``
(``env``, in ``Assignment.env``; the agent's launcher is yet to put them in the rank's environment).
"""

from __future__ import annotations

MAX_INDEXES = 1000
MAX_INDEX = 1_000_000


def parse(text: str) -> tuple[list[int], int | None]:
    """``"0-9%4"`` -> ``([0, 1, ..., 9], 4)``; ``"1,3,5-7"`` -> ``([1, 3, 5, 6, 7], None)``.  The indexes
    come sorted, each once; ``ValueError`` saying what is wrong."""
    body, _, cap_text = text.strip().partition("%")
    cap = None
    if cap_text:
        if not cap_text.isdigit() or int(cap_text) < 1:
            raise ValueError(f"{text!r}: after % give how many may run at once (as 0-9%4)")
        cap = int(cap_text)
    indexes: set[int] = set()
    for part in body.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{text!r}: give indexes as 0-9, 1,3,5-7 or 0-99%4")
        lo, hi = int(first), int(last) if dash else int(first)
        if hi < lo or hi > MAX_INDEX:
            raise ValueError(f"{text!r}: {part.strip()} is not a range of indexes from low to high "
                             f"(at most {MAX_INDEX})")
        if hi - lo + 1 + len(indexes) > MAX_INDEXES:
            raise ValueError(f"{text!r}: at most {MAX_INDEXES} jobs in one array")
        indexes.update(range(lo, hi + 1))
    return sorted(indexes), cap


def env(array_job_id: int, index: int, count: int) -> dict[str, str]:
    """What each rank of an array's job is told of its place in the array."""
    return {"GSCHED_ARRAY_JOB_ID": str(array_job_id), "GSCHED_ARRAY_INDEX": str(index),
            "GSCHED_ARRAY_COUNT": str(count)}

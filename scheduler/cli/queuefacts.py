"""What the queue view derives from a job summary: elapsed time, ETA, the reason in plain words.

Pure functions of (job summary, ``now``) shared by the rich views (``render``) and ``gsched queue
--json``, so scripts see the same figures as people.  No rich import here: ``gsched queue --json``
must start fast (nor ``scheduler.core.reasons``: a summary's ``why`` is read as the plain document
``Reason.as_dict()`` wrote).  ``now`` is the server's clock (the view's ``"time"``), never this machine's.
"""

from __future__ import annotations

from scheduler.protocol.states import ACTIVE, JobState

TYPE_CHECKING = False  # typing: 2 ms of start-up, for annotations only
if TYPE_CHECKING:
    from typing import Any


def human_bytes(n: float | None) -> str:
    """``1234567`` -> ``"1.2 MB"`` (decimal units, as disks and links are sold)."""
    n = float(n or 0)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover - the loop returns at TB


def human_s(seconds: float | None) -> str:
    """A duration in at most two units: ``"42s"``, ``"3m07s"``, ``"2h05m"``, ``"3d04h"``; ``"-"`` for None."""
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def elapsed_s(job: dict[str, Any], now: float) -> float:
    """Waited so far (PENDING), run so far (BOUND..RUNNING), or run in total (finished)."""
    if job["state"] == JobState.PENDING:
        return max(0.0, now - (job.get("pending_since") or job["submitted_at"]))
    start = job.get("started_at") or job.get("pending_since") or job["submitted_at"]
    if job["state"] in ACTIVE:
        return max(0.0, now - start)
    return max(0.0, (job.get("ended_at") or now) - start)


def epochs_progress(job: dict[str, Any]) -> float:
    """Epochs done, with the running epoch's fraction from the workload's step reports (``2.4``)."""
    done = float(job.get("epochs_done") or 0)
    train = (job.get("progress") or {}).get("train") or {}
    step, steps, epoch = train.get("step"), train.get("steps"), train.get("epoch")
    if isinstance(step, int) and isinstance(steps, int) and steps > 0 and epoch == int(done) + 1:
        done += min(1.0, step / steps)
    return done


def eta_s(job: dict[str, Any], now: float) -> float | None:
    """Seconds left for a RUNNING job at its pace so far, from epochs done; None when unknown.

    The pace is this attempt's: epochs done since ``started_at`` (a resumed job starts counting at its
    checkpoint's epoch, which ``progress.resumed_from`` would refine; without it the first epochs after
    a restart read as fast).
    """
    total = job.get("epochs") or 0
    done = epochs_progress(job)
    if job["state"] != JobState.RUNNING or done <= 0 or not job.get("started_at") or not total:
        return None
    per_epoch = max(0.0, now - job["started_at"]) / done
    return per_epoch * max(0.0, total - done)


def relative(at_s: float, at_word: str, now: float) -> str:
    """A reason's time as a person reads it at ``now``: "until T" -> "for 25s more" ("until now" once
    past), "from T" -> "in 25s" ("now" once past)."""
    delta = at_s - now
    if at_word == "until":
        return f"for {human_s(delta)} more" if delta > 0 else "until now"
    return f"in {human_s(delta)}" if delta > 0 else "now"


def plain_reason(job: dict[str, Any], now: float) -> str:
    """The one line a person reads in the REASON column; "" when there is nothing to say.

    PENDING: the cycle's reason, its scheduler time (the ``why`` document's ``at_s``, see
    ``scheduler.core.reasons``) as "in 25s" or "for 25s more" after its message; without a time, its
    words as stored.  STAGING: bytes staged so far; finished: why it ended (first line).
    """
    state = job["state"]
    if state == JobState.STAGING:
        stage = (job.get("progress") or {}).get("staging") or {}
        got = sum(v.get("bytes", 0) or 0 for v in stage.values())
        total = sum(v.get("total", 0) or 0 for v in stage.values())
        rate = sum(v.get("rate_bps", 0) or 0 for v in stage.values())
        if not total:
            return "staging data"
        text = f"staging {100 * got / total:.0f}% of {human_bytes(total)}"
        if rate > 0 and got < total:
            text += f", {human_bytes(rate)}/s, {human_s((total - got) / rate)} left"
        return text
    if state in (JobState.RUNNING, JobState.BOUND):
        restarts = job.get("restarts") or 0
        return f"restarted {restarts}x" if restarts else ""
    if state == JobState.COMPLETED:
        return ""
    reason = (job.get("reason") or "").strip().splitlines()
    if not reason:
        return ""
    text = reason[0]
    if state == JobState.PENDING and text == "submitted":
        return "submitted; waiting for the next cycle"
    why = job.get("why") if state == JobState.PENDING else None
    if why and why.get("at_s") is not None:
        return f"{why.get('message', '')} {relative(float(why['at_s']), why.get('at_word', 'until'), now)}"
    return text


def job_facts(job: dict[str, Any], now: float) -> dict[str, Any]:
    """The derived figures ``gsched queue --json`` adds to each job (same as the table shows)."""
    eta = eta_s(job, now)
    return {"elapsed_s": round(elapsed_s(job, now), 1), "eta_s": None if eta is None else round(eta, 1),
            "epochs_progress": round(epochs_progress(job), 3), "reason_text": plain_reason(job, now)}

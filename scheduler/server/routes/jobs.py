"""Jobs: submit, the queue, one job, why it waits, cancel and its logs.  Anyone with a user token reads
the queue and any job (log tails only for the owner and admins); only the owner or an admin cancels a
job or reads its logs.  Submits are queued to the group commit (``ctx.submits``)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field, TypeAdapter, ValidationError

from scheduler.server import jobcontrol
from scheduler.server import service as svc
from scheduler.server.api_models import MAX_ID, JobSubmit, JobUpdate
from scheduler.server.auth import Identity
from scheduler.server.fetch import fetch_manifest
from scheduler.server.routes.base import (
    PERSON,
    Access,
    JobId,
    Routes,
    again,
    bearer,
    context,
    known,
    read_json,
    validated,
    who,
)
from scheduler.server.views import JobFilter, explain_view, history_view, queue_view
from scheduler.store.models import Job

routes = Routes()
_job_id: TypeAdapter[int] = TypeAdapter(Annotated[int, Field(ge=1, le=MAX_ID)])  # as FastAPI reads JobId


def _own_job(s: Any, me: Identity, params: dict[str, Any]) -> None:
    """``Access.owner`` for routes on one job: the job the path names is ``me``'s."""
    try:
        job_id = _job_id.validate_python(params.get("job_id"))
    except ValidationError:
        return
    job = s.get(Job, job_id)
    if job is not None:
        svc.require_owner(job, me)


JOB_OWNER = Access("person", _own_job)


@routes.route("POST", "/v1/jobs", PERSON, status_code=201, openapi_extra=routes.body_doc(JobSubmit),
              responses={200: {"description": "Already submitted with this client_request_id: that job"}})
async def submit(request: Request) -> JSONResponse:
    """The body is read here (``read_json``, ``validated``: the same 422s), not declared: FastAPI's
    machinery for a declared body was a fifth of a submit's time on the event loop."""
    ctx = context(request)
    token = bearer(request)
    body = validated(JobSubmit, await read_json(request))

    def call(s: Any, now: float) -> tuple[Any, bool, list[int] | None]:
        job, created = svc.stage_job(s, now, known(s, token), body.spec, body.client_request_id,
                                     body.dependency, body.array, single_team=ctx.settings.run_as_agent_user,
                                     non_preemptible=ctx.settings.non_preemptible_users)
        return job, created, svc.array_members(s, job.id) if body.array else None  # an array's are flushed

    # the job is written with the batch's commit, which gives it its id (stage_job)
    job, created, ids = await asyncio.wrap_future(ctx.submits.submit(call))
    job_id = job.id
    ids = ids or [job_id]
    if created:
        ctx.poke()
    return JSONResponse({"id": job_id, "created": created, "ids": ids}, status_code=201 if created else 200)


States = Annotated[str | None, Query(max_length=200, pattern=r"^[A-Za-z,]*$",
                                    description="comma-separated job states (PENDING,RUNNING)")]
UserName = Annotated[str | None, Query(max_length=64, description="only this user's jobs")]
JobName = Annotated[str | None, Query(max_length=64, description="only jobs of this name")]
Limit = Annotated[int, Query(ge=1, le=10000, description="at most this many jobs in one answer")]
After = Annotated[int, Query(ge=0, le=MAX_ID, description="only jobs with a greater id (paging: the last `next`)")]
Time = Annotated[float | None, Query(ge=0, le=1e11, description="a time, in seconds since the epoch")]


@routes.route("GET", "/v1/jobs", PERSON)
def queue(request: Request, all: bool = False, user: UserName = None, state: States = None, name: JobName = None,
          ended_after: Time = None, limit: Limit = 5000, after: After = 0) -> dict[str, Any]:
    """The queue: jobs not ended (``all``: ended ones too; ``ended_after``: those ended since too),
    filtered here, oldest first; with ``next``, the id to pass as ``after`` for the page after (None:
    this was the last)."""
    ctx = context(request)
    f = JobFilter.of(user=user, states=state, name=name, limit=limit, after=after, ended_after=ended_after)
    with ctx.db.read() as s:
        return queue_view(s, ctx.clock.now(), ctx.settings.policy, include_done=all or bool(f.states) or ended_after is not None,
                          where=f, disk_floor_bytes=ctx.settings.disk_floor_bytes)


@routes.route("GET", "/v1/history", PERSON)
def history(request: Request, user: UserName = None, state: States = None, name: JobName = None,
            since: Time = None, until: Time = None, limit: Limit = 1000, after: After = 0) -> dict[str, Any]:
    """Ended jobs (as ``sacct``): those that ended in [``since``, ``until``), oldest id first, paged."""
    ctx = context(request)
    f = JobFilter.of(user=user, states=state, name=name, limit=limit, after=after, since=since, until=until)
    with ctx.db.read() as s:
        return history_view(s, ctx.clock.now(), f)


@routes.route("GET", "/v1/jobs/{job_id}", PERSON)
def show(job_id: JobId, request: Request) -> dict[str, Any]:
    me = who(request)
    with context(request).db.read() as s:
        job = svc.get_job(s, job_id)
        return svc.job_detail(s, job, with_logs=me.is_admin or job.user == me.name)


@routes.route("GET", "/v1/jobs/{job_id}/explain", PERSON)
def explain(job_id: JobId, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.read() as s:
        return explain_view(s, svc.get_job(s, job_id), ctx.settings.disk_floor_bytes)


@routes.route("POST", "/v1/jobs/{job_id}/cancel", JOB_OWNER)
def cancel(job_id: JobId, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        state = svc.cancel_job(s, ctx.clock.now(), again(s, request), job_id)
    ctx.poke()
    return {"id": job_id, "state": state}


@routes.route("GET", "/v1/jobs/{job_id}/logs", JOB_OWNER)
def logs(job_id: JobId, request: Request, rank: Annotated[int | None, Query(ge=0, le=4096)] = None,
         after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0) -> dict[str, Any]:
    me = who(request)
    with context(request).db.read() as s:
        job = svc.get_job(s, job_id)
        svc.require_owner(job, me)
        return svc.job_logs(s, job, rank, after)


@routes.route("GET", "/v1/jobs/{job_id}/fetch", JOB_OWNER)
def fetch(job_id: JobId, request: Request) -> dict[str, Any]:
    """``gsched fetch``: the final checkpoint's sources with read tickets, and the metric lines."""
    me = who(request)
    with context(request).db.read() as s:
        job = svc.get_job(s, job_id)
        svc.require_owner(job, me)
        return fetch_manifest(s, job)


@routes.route("POST", "/v1/jobs/{job_id}/hold", JOB_OWNER)
def hold(job_id: JobId, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        return jobcontrol.hold_job(s, ctx.clock.now(), again(s, request), job_id)


@routes.route("POST", "/v1/jobs/{job_id}/release", JOB_OWNER)
def release(job_id: JobId, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        out = jobcontrol.release_job(s, ctx.clock.now(), again(s, request), job_id)
    ctx.poke()
    return out


@routes.route("POST", "/v1/jobs/{job_id}/requeue", JOB_OWNER)
def requeue(job_id: JobId, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        out = jobcontrol.requeue_job_by(s, ctx.clock.now(), again(s, request), job_id)
    ctx.poke()
    return out


@routes.route("PATCH", "/v1/jobs/{job_id}", JOB_OWNER)
def update(job_id: JobId, body: JobUpdate, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        return jobcontrol.update_job(s, ctx.clock.now(), again(s, request), job_id, body.name, body.time_limit_s)

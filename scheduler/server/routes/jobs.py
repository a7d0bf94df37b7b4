"""Jobs: submit, the queue, one job, why it waits, cancel and its logs.  Anyone with a user token reads
the queue and any job (log tails only for the owner and admins); only the owner or an admin cancels a
job or reads its logs.  Submits are queued to the group commit (``ctx.submits``)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field, TypeAdapter, ValidationError

from scheduler.server import service as svc
from scheduler.server.api_models import MAX_ID, JobSubmit
from scheduler.server.auth import Identity
from scheduler.server.routes.base import PERSON, Access, JobId, Routes, again, bearer, context, known, who
from scheduler.server.views import explain_view, queue_view
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


@routes.route("POST", "/v1/jobs", PERSON, status_code=201,
              responses={200: {"description": "Already submitted with this client_request_id: that job"}})
async def submit(body: JobSubmit, request: Request) -> JSONResponse:
    ctx = context(request)
    token = bearer(request)

    def call(s: Any, now: float) -> tuple[int, bool]:
        return svc.submit_job(s, now, known(s, token), body.spec, body.client_request_id,
                              single_team=ctx.settings.run_as_agent_user)

    job_id, created = await asyncio.wrap_future(ctx.submits.submit(call))
    if created:
        ctx.poke()
    return JSONResponse({"id": job_id, "created": created}, status_code=201 if created else 200)


@routes.route("GET", "/v1/jobs", PERSON)
def queue(request: Request, all: bool = False) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.read() as s:
        return queue_view(s, ctx.clock.now(), ctx.settings.policy, include_done=all)


@routes.route("GET", "/v1/jobs/{job_id}", PERSON)
def show(job_id: JobId, request: Request) -> dict[str, Any]:
    me = who(request)
    with context(request).db.read() as s:
        job = svc.get_job(s, job_id)
        return svc.job_detail(s, job, with_logs=me.is_admin or job.user == me.name)


@routes.route("GET", "/v1/jobs/{job_id}/explain", PERSON)
def explain(job_id: JobId, request: Request) -> dict[str, Any]:
    with context(request).db.read() as s:
        return explain_view(s, svc.get_job(s, job_id))


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

"""Who may call what: every endpoint against every kind of caller, on a real server.

Columns: no token, a wrong token, another user (bob), the owner (alice: owns the job and the data set),
an admin, the agent of the node the request is about (n1), and the agent of another node (n2).
Rules (scheduler/server/app.py): anyone with a user token reads the queue; only the owner or an admin acts on
a job or a data set; only admins manage users and tokens; agent tokens do nothing but their own
node's heartbeat.  Placeholders: ``{job}`` alice's job, ``{fresh_job}`` a new job of alice's made for
the cell (cancel consumes it), ``{fresh_user}`` a new user made for the cell, ``{dataset}`` alice's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.security.conftest import SHA0, World

pytestmark = pytest.mark.integration

WHO = ("none", "wrong", "other", "owner", "admin", "agent_here", "agent_other")
READ = (401, 401, 200, 200, 200, 403, 403)  # any user or admin; no agent
MATRIX: list[tuple[str, tuple[int, ...]]] = [
    # endpoint                                     none wrong other owner admin here other-agent
    ("GET /v1/health",                             (200, 200, 200, 200, 200, 200, 200)),
    ("GET /metrics",                               (200, 200, 200, 200, 200, 200, 200)),  # scraped without a token
    ("GET /v1/whoami",                             (401, 401, 200, 200, 200, 200, 200)),
    ("GET /v1/jobs",                               READ),
    ("GET /v1/jobs/{job}",                         READ),
    ("GET /v1/jobs/{job}/explain",                 READ),
    ("GET /v1/jobs/{job}/logs",                    (401, 401, 403, 200, 200, 403, 403)),
    ("GET /v1/jobs/{job}/fetch",                   (401, 401, 403, 200, 200, 403, 403)),  # read tickets: owner, admin
    ("POST /v1/jobs/{fresh_job}/cancel",           (401, 401, 403, 200, 200, 403, 403)),
    ("POST /v1/jobs",                              (401, 401, 201, 201, 201, 403, 403)),
    ("POST /v1/jobs/{fresh_job}/hold",             (401, 401, 403, 200, 200, 403, 403)),
    ("POST /v1/jobs/{fresh_job}/release",          (401, 401, 403, 200, 200, 403, 403)),
    ("POST /v1/jobs/{fresh_job}/requeue",          (401, 401, 403, 409, 409, 403, 403)),  # allowed; it is PENDING
    ("PATCH /v1/jobs/{fresh_job}",                 (401, 401, 403, 200, 200, 403, 403)),
    ("GET /v1/history",                            READ),
    ("GET /v1/events",                             READ),
    ("GET /v1/nodes",                              READ),
    ("POST /v1/nodes/{node}/drain",                (401, 401, 403, 403, 200, 403, 403)),
    ("POST /v1/nodes/{node}/resume",               (401, 401, 403, 403, 200, 403, 403)),
    ("GET /v1/datasets",                           READ),
    ("GET /v1/transfers",                          READ),
    ("GET /v1/share",                              READ),
    ("GET /v1/cluster/history",                    READ),
    ("POST /v1/datasets",                          (401, 401, 201, 201, 201, 403, 403)),
    ("POST /v1/datasets/{dataset}/place",          (401, 401, 403, 200, 200, 403, 403)),
    ("POST /v1/datasets/{new_dataset}/scan",       (401, 401, 200, 200, 200, 403, 403)),  # any user may register
    # the owner or an admin may roll a registration back; this one's data set is read by a job: refused
    ("POST /v1/datasets/{dataset}/abandon",        (401, 401, 403, 409, 409, 403, 403)),
    ("GET /v1/users",                              (401, 401, 403, 403, 200, 403, 403)),
    ("POST /v1/users",                             (401, 401, 403, 403, 201, 403, 403)),
    ("DELETE /v1/users/{fresh_user}",              (401, 401, 403, 403, 200, 403, 403)),
    ("PUT /v1/users/{fresh_user}/shares",          (401, 401, 403, 403, 200, 403, 403)),
    ("PUT /v1/users/{fresh_user}/unix-user",       (401, 401, 403, 403, 200, 403, 403)),
    ("PUT /v1/users/{fresh_user}/account",         (401, 401, 403, 403, 200, 403, 403)),
    ("GET /v1/accounts",                           READ),
    ("POST /v1/accounts",                          (401, 401, 403, 403, 201, 403, 403)),
    ("PUT /v1/accounts/{fresh_account}/parent",    (401, 401, 403, 403, 200, 403, 403)),
    ("GET /v1/share/tree",                         READ),
    ("POST /v1/agent-tokens",                      (401, 401, 403, 403, 201, 403, 403)),
    ("POST /v1/agent/heartbeat",                   (401, 401, 403, 403, 403, 200, 403)),  # a report for n1
]
CELLS = [(endpoint, who, expected) for endpoint, row in MATRIX for who, expected in zip(WHO, row, strict=True)]

_counter = iter(range(1, 10**6))


def body_for(w: World, endpoint: str) -> Any:
    n = next(_counter)
    bodies: dict[str, Callable[[], Any]] = {
        "POST /v1/jobs": lambda: {"spec": {"name": f"m{n}", "data": {"dataset": w.dataset}}},
        "POST /v1/datasets": lambda: {"name": f"d{n}", "classes": 2, "image_shape": [3, 8, 8], "replicas": 1,
                                      "shards": [{"index": 0, "bytes": 1, "sha256": SHA0, "samples": 1}]},
        "POST /v1/datasets/{dataset}/place": lambda: {"replicas": 1},
        "POST /v1/datasets/{new_dataset}/scan": lambda: w.scan_body("n1"),
        "POST /v1/datasets/{dataset}/abandon": lambda: {"failed": [{"node": "n1", "shard": 0}], "reason": "matrix"},
        "POST /v1/users": lambda: {"name": f"u{n}"},
        "PUT /v1/users/{fresh_user}/shares": lambda: {"shares": 2},
        "PUT /v1/users/{fresh_user}/unix-user": lambda: {"unix_user": "nobody"},
        "PUT /v1/users/{fresh_user}/account": lambda: {"account": "root"},
        "POST /v1/accounts": lambda: {"name": f"acct{n}", "shares": 2},
        "PUT /v1/accounts/{fresh_account}/parent": lambda: {"parent": "root"},
        "POST /v1/agent-tokens": lambda: {"node": "n9"},
        "POST /v1/agent/heartbeat": lambda: w.heartbeat("n1"),
        "POST /v1/jobs/{fresh_job}/cancel": lambda: {},
        "POST /v1/jobs/{fresh_job}/hold": lambda: {},
        "POST /v1/jobs/{fresh_job}/release": lambda: {},
        "POST /v1/jobs/{fresh_job}/requeue": lambda: {},
        "PATCH /v1/jobs/{fresh_job}": lambda: {"time_limit_s": 60, "name": f"renamed{n}"},
        "POST /v1/nodes/{node}/drain": lambda: {"reason": "matrix"},
        "POST /v1/nodes/{node}/resume": lambda: {},
    }
    make = bodies.get(endpoint)
    return make() if make else None


def path_for(w: World, path: str) -> str:
    if "{fresh_job}" in path:
        path = path.replace("{fresh_job}", str(w.new_job("victim")))
    if "{fresh_user}" in path:
        path = path.replace("{fresh_user}", w.new_user())
    if "{fresh_account}" in path:
        name = f"fresh{next(_counter)}"
        w.ok("POST", "/v1/accounts", "admin", {"name": name})
        path = path.replace("{fresh_account}", name)
    if "{new_dataset}" in path:
        path = path.replace("{new_dataset}", f"new{next(_counter)}")
    return path.replace("{job}", str(w.job)).replace("{dataset}", w.dataset).replace("{node}", "n1")


def token_of(w: World, who: str) -> str | None:
    return {"none": None, "wrong": "gsu_" + "x" * 43}.get(who, w.tokens.get(who))


@pytest.mark.parametrize("endpoint,who,expected", CELLS, ids=[f"{e} as {who}" for e, who, _ in CELLS])
def test_matrix(world: World, endpoint: str, who: str, expected: int) -> None:
    method, path = endpoint.split(" ", 1)
    status, out = world.call(method, path_for(world, path), token_of(world, who), body_for(world, endpoint))
    assert status == expected, f"{endpoint} as {who}: {status} {out}"
    if status >= 400:
        assert isinstance(out, dict) and out.get("detail"), out  # a message, not an empty error


# The same routes with a malformed body, path or query: who is asked first (authenticate, then
# authorize), what is wrong with the request only after.  No token or a wrong one is 401 and says
# nothing about the request; a caller who may not act is 403; only callers who may act hear 422.
NOT_JSON = b'{"name": '
PERSON = (401, 401, 422, 422, 422, 403, 403)  # any user or admin may call it
OWNER = (401, 401, 403, 422, 422, 403, 403)  # the owner of the job or data set, or an admin
ADMIN = (401, 401, 403, 403, 422, 403, 403)
MISSING_TOKEN = "missing token: set GSCHED_TOKEN or pass --token"
BAD: list[tuple[str, str, Any, tuple[int, ...]]] = [
    # route (as in MATRIX)                 the request made                       its body    none wrong other owner admin here other-agent
    ("POST /v1/jobs",                      "/v1/jobs",                            {"bogus": 1},     PERSON),
    ("POST /v1/jobs",                      "/v1/jobs",                            NOT_JSON,         PERSON),
    ("POST /v1/jobs",                      "/v1/jobs",                            {"spec": []},     PERSON),
    ("POST /v1/datasets",                  "/v1/datasets",                        {"bogus": 1},     PERSON),
    ("POST /v1/datasets",                  "/v1/datasets",                        NOT_JSON,         PERSON),
    ("POST /v1/datasets/{dataset}/place",  "/v1/datasets/{dataset}/place",        {"bogus": 1},     OWNER),
    ("POST /v1/datasets/{dataset}/place",  "/v1/datasets/{dataset}/place",        NOT_JSON,         OWNER),
    ("POST /v1/datasets/{dataset}/place",  "/v1/datasets/{dataset}/place",        {"replicas": 0},  OWNER),
    ("POST /v1/datasets/{dataset}/place",  "/v1/datasets/" + "x" * 65 + "/place", {"replicas": 1},  PERSON),
    ("POST /v1/datasets/{new_dataset}/scan", "/v1/datasets/{new_dataset}/scan",   {"bogus": 1},     PERSON),
    ("POST /v1/datasets/{dataset}/abandon", "/v1/datasets/{dataset}/abandon",   {"bogus": 1},     OWNER),
    ("POST /v1/datasets/{dataset}/abandon", "/v1/datasets/{dataset}/abandon",   NOT_JSON,         OWNER),
    ("POST /v1/datasets/{new_dataset}/scan", "/v1/datasets/{new_dataset}/scan",   NOT_JSON,         PERSON),
    ("POST /v1/datasets/{new_dataset}/scan", "/v1/datasets/{new_dataset}/scan",   {"nodes": []},    PERSON),
    ("POST /v1/datasets/{new_dataset}/scan", "/v1/datasets/{new_dataset}/scan",   {"nodes": ["n 1"]}, PERSON),
    ("POST /v1/datasets/{new_dataset}/scan", "/v1/datasets/Bad..Name/scan",       {"nodes": ["n1"]}, PERSON),
    ("POST /v1/users",                     "/v1/users",                           {"bogus": 1},     ADMIN),
    ("POST /v1/users",                     "/v1/users",                           NOT_JSON,         ADMIN),
    ("PUT /v1/users/{fresh_user}/shares",  "/v1/users/{fresh_user}/shares",       {"bogus": 1},     ADMIN),
    ("PUT /v1/users/{fresh_user}/shares",  "/v1/users/{fresh_user}/shares",       NOT_JSON,         ADMIN),
    ("PUT /v1/users/{fresh_user}/shares",  "/v1/users/" + "x" * 65 + "/shares",   {"shares": 2},    ADMIN),
    ("PUT /v1/users/{fresh_user}/unix-user", "/v1/users/{fresh_user}/unix-user",  {"bogus": 1},     ADMIN),
    ("PUT /v1/users/{fresh_user}/unix-user", "/v1/users/{fresh_user}/unix-user",  NOT_JSON,         ADMIN),
    ("PUT /v1/users/{fresh_user}/unix-user", "/v1/users/{fresh_user}/unix-user",  {"unix_user": "../etc"}, ADMIN),
    ("PUT /v1/users/{fresh_user}/unix-user", "/v1/users/{fresh_user}/unix-user",  {"unix_user": "a b"}, ADMIN),
    ("DELETE /v1/users/{fresh_user}",      "/v1/users/" + "x" * 65,               None,             ADMIN),
    ("PUT /v1/users/{fresh_user}/account", "/v1/users/{fresh_user}/account",      {"bogus": 1},     ADMIN),
    ("PUT /v1/users/{fresh_user}/account", "/v1/users/{fresh_user}/account",      NOT_JSON,         ADMIN),
    ("PUT /v1/users/{fresh_user}/account", "/v1/users/{fresh_user}/account",      {"account": "nope"}, ADMIN),
    ("PUT /v1/users/{fresh_user}/account", "/v1/users/" + "x" * 65 + "/account",  {"account": "root"}, ADMIN),
    ("POST /v1/accounts",                  "/v1/accounts",                        {"bogus": 1},     ADMIN),
    ("POST /v1/accounts",                  "/v1/accounts",                        NOT_JSON,         ADMIN),
    ("POST /v1/accounts",                  "/v1/accounts",                        {"name": "Bad Name"}, ADMIN),
    ("POST /v1/accounts",                  "/v1/accounts",                        {"name": "ok", "parent": "nope"}, ADMIN),
    ("PUT /v1/accounts/{fresh_account}/parent", "/v1/accounts/{fresh_account}/parent", {"bogus": 1}, ADMIN),
    ("PUT /v1/accounts/{fresh_account}/parent", "/v1/accounts/{fresh_account}/parent", NOT_JSON,    ADMIN),
    ("PUT /v1/accounts/{fresh_account}/parent", "/v1/accounts/" + "x" * 65 + "/parent", {"parent": "root"}, ADMIN),
    ("POST /v1/agent-tokens",              "/v1/agent-tokens",                    {"bogus": 1},     ADMIN),
    ("POST /v1/agent-tokens",              "/v1/agent-tokens",                    NOT_JSON,         ADMIN),
    # A heartbeat names its node in its body: another node's agent is refused once the body is JSON.
    ("POST /v1/agent/heartbeat",           "/v1/agent/heartbeat",                 "n1+bogus",       (401, 401, 403, 403, 403, 422, 403)),
    ("POST /v1/agent/heartbeat",           "/v1/agent/heartbeat",                 NOT_JSON,         (401, 401, 403, 403, 403, 422, 422)),
    ("GET /v1/jobs",                       "/v1/jobs?all=maybe",                  None,             PERSON),
    ("GET /v1/jobs/{job}",                 "/v1/jobs/abc",                        None,             PERSON),
    ("GET /v1/jobs/{job}",                 "/v1/jobs/-1",                         None,             PERSON),
    ("GET /v1/jobs/{job}/explain",         "/v1/jobs/0/explain",                  None,             PERSON),
    ("GET /v1/jobs/{job}/logs",            "/v1/jobs/{job}/logs?rank=-1",         None,             OWNER),
    ("GET /v1/jobs/{job}/logs",            "/v1/jobs/{job}/logs?after=x",         None,             OWNER),
    ("GET /v1/jobs/{job}/logs",            "/v1/jobs/abc/logs",                   None,             PERSON),  # whose job is unknown
    ("GET /v1/jobs/{job}/fetch",           "/v1/jobs/abc/fetch",                  None,             PERSON),  # whose job is unknown
    ("POST /v1/jobs/{fresh_job}/cancel",   "/v1/jobs/abc/cancel",                 None,             PERSON),
    ("POST /v1/jobs/{fresh_job}/hold",     "/v1/jobs/abc/hold",                   None,             PERSON),
    ("POST /v1/jobs/{fresh_job}/release",  "/v1/jobs/0/release",                  None,             PERSON),
    ("POST /v1/jobs/{fresh_job}/requeue",  "/v1/jobs/-3/requeue",                 None,             PERSON),
    ("PATCH /v1/jobs/{fresh_job}",         "/v1/jobs/{fresh_job}",                {"bogus": 1},     OWNER),
    ("PATCH /v1/jobs/{fresh_job}",         "/v1/jobs/{fresh_job}",                NOT_JSON,         OWNER),
    ("PATCH /v1/jobs/{fresh_job}",         "/v1/jobs/{fresh_job}",                {"time_limit_s": 0}, OWNER),
    ("PATCH /v1/jobs/{fresh_job}",         "/v1/jobs/{fresh_job}",                {"name": "bad name!"}, OWNER),
    ("GET /v1/history",                    "/v1/history?limit=0",                 None,             PERSON),
    ("GET /v1/history",                    "/v1/history?state=bogus",             None,             PERSON),
    ("GET /v1/history",                    "/v1/history?state=running",           None,             PERSON),  # not ended
    ("GET /v1/history",                    "/v1/history?since=abc",               None,             PERSON),
    ("GET /v1/jobs",                       "/v1/jobs?state=nope",                 None,             PERSON),
    ("POST /v1/nodes/{node}/drain",        "/v1/nodes/{node}/drain",              {"bogus": 1},     ADMIN),
    ("POST /v1/nodes/{node}/drain",        "/v1/nodes/{node}/drain",              NOT_JSON,         ADMIN),
    ("POST /v1/nodes/{node}/drain",        "/v1/nodes/" + "x" * 65 + "/drain",    {"reason": ""},   ADMIN),
    ("POST /v1/nodes/{node}/resume",       "/v1/nodes/" + "x" * 65 + "/resume",   None,             ADMIN),
    ("GET /v1/events",                     "/v1/events?limit=0",                  None,             PERSON),
    ("GET /v1/events",                     "/v1/events?job=abc",                  None,             PERSON),
    ("GET /v1/cluster/history",            "/v1/cluster/history?since=abc",       None,             PERSON),
    ("GET /v1/cluster/history",            "/v1/cluster/history?limit=0",         None,             PERSON),
    # Unknown paths and methods: who asks is known before the server says there is no such thing.
    ("GET /v1/nope",                       "/v1/nope",                            None,             (401, 401, 404, 404, 404, 404, 404)),
    ("DELETE /v1/jobs",                    "/v1/jobs",                            {"bogus": 1},     (401, 401, 405, 405, 405, 405, 405)),
]
BAD_CELLS = [(route, path, body, who, expected) for route, path, body, row in BAD
             for who, expected in zip(WHO, row, strict=True)]


def bad_body(w: World, body: Any) -> Any:
    return {**w.heartbeat("n1"), "bogus": 1} if body == "n1+bogus" else body


@pytest.mark.parametrize("route,path,body,who,expected", BAD_CELLS,
                         ids=[f"{r.split()[0]} {p} {b!r:.12} as {who}" for r, p, b, who, _ in BAD_CELLS])
def test_malformed_requests(world: World, route: str, path: str, body: Any, who: str, expected: int) -> None:
    method = route.split(" ", 1)[0]
    status, out = world.call(method, path_for(world, path), token_of(world, who), bad_body(world, body))
    assert status == expected, f"{method} {path} {body!r} as {who}: {status} {out}"
    assert isinstance(out, dict) and out.get("detail"), out
    if status == 401:  # nothing about the request: not its fields, not its schema
        assert out == {"detail": MISSING_TOKEN if who == "none" else "invalid token", "field": None}, out
    elif status == 403:
        assert out["field"] is None, out
    elif status == 422:
        assert out["field"], out  # the field that is wrong is named to those who may act


def test_malformed_requests_cover_every_route_with_input(world: World) -> None:
    """Each operation that takes a body, a path or a query parameter has a malformed case in ``BAD``."""
    schema = world.ok("GET", "/openapi.json")
    takes = {f"{m.upper()} {re.sub(r'{[^}]+}', '{}', p)}" for p, ops in schema["paths"].items()
             for m, op in ops.items() if op.get("parameters") or op.get("requestBody")}
    covered = {re.sub(r"{[^}]+}", "{}", route) for route, _, _, _ in BAD}
    assert takes - covered == set()


def test_matrix_covers_every_route(world: World) -> None:
    """A new route must get a row here (and so a decision about who may call it)."""
    schema = world.ok("GET", "/openapi.json")
    routes = {f"{m.upper()} {re.sub(r'{[^}]+}', '{}', p)}" for p, ops in schema["paths"].items() for m in ops}
    covered = {re.sub(r"{[^}]+}", "{}", e) for e, _ in MATRIX}
    assert routes - covered == set()


def test_wrong_kinds_of_token_are_refused(world: World) -> None:
    for token in ("gsa_" + "x" * 43, "x" * 47, world.tokens["owner"][:-1], world.tokens["owner"] + "x"):
        assert world.call("GET", "/v1/whoami", token)[0] == 401
    assert world.call("GET", "/v1/whoami", None)[1]["detail"].startswith("missing token")


def test_an_agent_cannot_report_for_another_node(world: World) -> None:
    before = {n["name"]: n["address"] for n in world.ok("GET", "/v1/nodes")}
    hb = {**world.heartbeat("n1"), "address": "10.6.6.6:1"}
    status, out = world.call("POST", "/v1/agent/heartbeat", world.tokens["agent_other"], hb)
    assert status == 403 and "n1" in out["detail"]
    assert {n["name"]: n["address"] for n in world.ok("GET", "/v1/nodes")} == before


def test_non_owners_do_not_see_log_tails(world: World) -> None:
    assert world.ok("GET", f"/v1/jobs/{world.job}", "other")["user"] == "alice"  # the queue is public
    for r in world.ok("GET", f"/v1/jobs/{world.job}", "other")["ranks"]:
        assert r["log_tail"] == ""


def test_the_last_admin_cannot_be_removed(world: World) -> None:
    status, out = world.call("DELETE", "/v1/users/admin", world.tokens["admin"])
    assert status == 409 and "last admin" in out["detail"]


def test_every_change_is_in_the_event_log(world: World) -> None:
    """Who did what, and when: each kind of change, made here, is in ``gsched events``."""
    name = world.new_user()
    world.ok("PUT", f"/v1/users/{name}/shares", "admin", {"shares": 3})
    world.ok("DELETE", f"/v1/users/{name}", "admin")
    world.ok("POST", "/v1/agent-tokens", "admin", {"node": "n7"})
    world.ok("POST", f"/v1/datasets/{world.dataset}/place", "owner", {"replicas": 1})
    job = world.new_job("audited")
    world.ok("POST", f"/v1/jobs/{job}/cancel", "admin")
    events = world.ok("GET", "/v1/events?limit=1000")
    seen = {(e["kind"], e["actor"]) for e in events}
    for kind, actor in [("user.add", "admin"), ("user.shares", "admin"), ("user.remove", "admin"),
                        ("agent-token.create", "admin"), ("data.make", "alice"), ("data.place", "alice"),
                        ("job.submit", "alice"), ("job.cancel", "admin")]:
        assert (kind, actor) in seen, f"no {kind} by {actor}"
    assert all(e["time"] > 0 for e in events)
    out = world.cluster.cli("events", "--job", str(job), token=world.tokens["owner"])
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and "job.submit" in lines[0] and "job.cancel" in lines[1] and "admin" in lines[1], lines


def test_a_body_declared_too_large_is_refused_before_it_is_read(world: World) -> None:
    import http.client
    from urllib.parse import urlsplit

    from scheduler.server.app import MAX_BODY_BYTES

    u = urlsplit(world.url)
    for declared in (str(MAX_BODY_BYTES + 1), "12abc"):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        try:  # only the headers and a few bytes are sent: the server must answer without waiting for the rest
            conn.putrequest("POST", "/v1/jobs")
            conn.putheader("Authorization", f"Bearer {world.tokens['owner']}")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", declared)
            conn.endheaders(b"{}")
            resp = conn.getresponse()
            assert resp.status == 413 if declared.isdigit() else resp.status in (400, 413)
            if resp.status == 413:
                assert "larger than" in resp.read().decode()
        finally:
            conn.close()


def test_a_removed_users_token_is_refused_at_once(world: World) -> None:
    """The gate keeps who a token is for a few seconds; removing the user forgets it at once."""
    token = world.cluster.add_user("leaving")
    assert world.call("GET", "/v1/whoami", token) == (200, {"kind": "user", "name": "leaving"})  # the gate knows it
    world.ok("DELETE", "/v1/users/leaving", "admin")
    for method, path, body in (("GET", "/v1/whoami", None), ("GET", "/v1/jobs", None), ("POST", "/v1/jobs", {"spec": {}})):
        assert world.call(method, path, token, body) == (401, {"detail": "invalid token", "field": None}), path


def test_the_hot_routes_are_tried_first_and_take_only_their_own_requests() -> None:
    """The router tries heartbeats and submits before anything else (app._hot_routes_first); every
    other route keeps its place, and no other route's method and path is one of theirs."""
    import tempfile
    from pathlib import Path

    from scheduler.server.app import HOT_ROUTES, create_app
    from scheduler.server.config import Settings
    from scheduler.server.main import make_context

    home = Path(tempfile.mkdtemp())
    ctx = make_context(Settings(db=f"sqlite:///{home / 'g.db'}", home=home))
    routes = create_app(ctx).router.routes
    firsts = [(next(iter(r.methods)), r.path) for r in routes[:len(HOT_ROUTES)]]
    assert firsts == list(HOT_ROUTES)
    rest = [(m, r.path) for r in routes[len(HOT_ROUTES):] for m in (getattr(r, "methods", None) or ())]
    assert not set(rest) & set(HOT_ROUTES)
    assert rest.index(("GET", "/v1/health")) < rest.index(("GET", "/v1/jobs"))  # the others in their order
    ctx.db.dispose()


def test_a_body_that_is_not_json_is_named_and_located(world: World) -> None:
    """Broken JSON is a 422 naming the body and the character where it broke, not a bare position."""
    status, out = world.call("POST", "/v1/jobs", token_of(world, "owner"), NOT_JSON)
    assert status == 422, out
    assert out["field"] == "body" and out["detail"].startswith("body: not valid JSON ("), out
    assert f"at character {len(NOT_JSON)})" in out["detail"], out

"""Section ``control``: the control plane against a real ``gsched server`` on loopback, run the same way
on each database side by side: SQLite (a file in a temp dir) and PostgreSQL (a throw-away PostgreSQL 15
cluster, ``scheduler/store/throwaway_postgres.py``, with PostgreSQL's durable defaults: fsync and
synchronous commit on, as in production).  Where PostgreSQL cannot be started here, its figures say
why and the section goes on.

1. Submit throughput: a server (no real agents; 5,000 fake nodes registered by a first heartbeat each
   from their own agent token, so that submit's device check passes; one data set registered with
   ``POST /v1/datasets``) takes ``POST /v1/jobs`` from 8 client threads with keep-alive connections
   (``http.client``: the lightest client, as the load generator shares the server's cores) for 10 s.
   Baseline: ``GET /v1/health`` from the same threads for the same time (the HTTP floor).  Each
   client waits for its answer, so this rate is at most 8 / latency; after (2), the same from 16 and
   32 threads, and the best of the three is the server's submit capacity, the figure the target
   (>= 1,000 jobs/s) is read against, with its p99.
2. Heartbeats: 1,000, then 5,000 of those agents post a real heartbeat every 5 s for 20 s, spread
   evenly, from a pool of threads (one per 50 agents, each with its own keep-alive connection, opened
   before the clock starts), while the server's cycle runs every second over the jobs submitted in
   (1) (their data has no live copy, so they stay pending and every cycle does the whole work).  The
   figure counts the heartbeats that got an answer against those due: a server that falls behind
   shows there as well as in the latency.  Baseline: the same heartbeat from one agent alone, before
   the others start (cycles running).

``--quick``: both databases, 4 threads (then 8 and 16) for 2 s of submits, fleets of 40 and 200 agents
for 4 s.

The clients run on the same 2 cores as the server, so the figures are lower bounds of the server;
each figure carries the machine's load average (``/proc/loadavg``) when it started, and the CPU time
the server process (its cycle process included, which runs every second whatever the load) and the
PostgreSQL server (all its backends) spent per request over the figure's stretch: where other work
shares the cores, the rates move with it and the CPU per request far less.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Figure, Report
from scheduler.cli.localcluster import LocalCluster, free_port
from scheduler.store.throwaway_postgres import ThrowawayPostgres, unavailable

SPEC = {"name": "bench", "resources": {"ranks": 1, "gpus_per_rank": 1}, "data": {"dataset": "benchdata"},
        "train": {"epochs": 1}, "limits": {"time": 600}}


def _heartbeat(node: str, incarnation: str = "bench") -> dict[str, Any]:
    return {"node": node, "rack": "rack0", "address": "127.0.0.1:9", "incarnation": incarnation,
            "devices": [{"index": i} for i in range(8)], "free_bytes": 10**12, "replicas": []}


class _Conn:
    """One keep-alive HTTP/1.1 connection (``http.client``): the load generator shares the server's 2
    cores, and httpx spent about three times the CPU per request, which the server then lacked."""

    def __init__(self, url: str) -> None:
        import http.client
        from urllib.parse import urlsplit

        u = urlsplit(url)
        self.conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=30)

    def request(self, method: str, path: str, token: str | None = None, body: Any = None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=headers)
        r = self.conn.getresponse()
        r.read()
        return r.status

    def close(self) -> None:
        self.conn.close()


def _hammer(url: str, token: str, seconds: float, threads: int, method: str, path: str,
            body: Any = None) -> tuple[int, float, list[float]]:
    stop = time.perf_counter() + seconds
    counts = [0] * threads
    lats: list[list[float]] = [[] for _ in range(threads)]

    def worker(i: int) -> None:
        c = _Conn(url)
        try:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                status = c.request(method, path, token, body)
                if status < 300:
                    counts[i] += 1
                    lats[i].append(time.perf_counter() - t0)
        finally:
            c.close()

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts), time.perf_counter() - t0, [x for per_thread in lats for x in per_thread]


def _agents(url: str, tokens: dict[str, str], period_s: float, seconds: float, threads: int) -> list[float]:
    """Each node heartbeats every ``period_s``, phases spread evenly; returns the latencies (s)."""
    names = sorted(tokens)
    lats: list[list[float]] = [[] for _ in range(threads)]
    ready = threading.Barrier(threads + 1)
    clock: dict[str, float] = {}

    def worker(i: int) -> None:
        mine = names[i::threads]
        c = _Conn(url)
        try:
            c.request("GET", "/v1/health")  # connect first: an agent keeps its connection; opening one is not heartbeat latency
            ready.wait()
            start, stop = clock["start"], clock["stop"]
            due = {n: start + period_s * (k * threads + i) / len(names) for k, n in enumerate(mine)}
            while True:
                n = min(due, key=lambda x: due[x])
                if due[n] >= stop or time.perf_counter() >= stop:
                    return  # one that fell so far behind that it is still due at the end is not sent: not answered
                wait = due[n] - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                body = _heartbeat(n)
                body["replicas"] = None  # unchanged since the full report: what agents send
                t0 = time.perf_counter()
                status = c.request("POST", "/v1/agent/heartbeat", tokens[n], body)
                if status < 300:
                    lats[i].append(time.perf_counter() - t0)
                due[n] += period_s
        finally:
            c.close()

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    clock["start"] = time.perf_counter() + 0.5
    clock["stop"] = clock["start"] + seconds
    ready.wait()
    for t in ts:
        t.join()
    return [x for per_thread in lats for x in per_thread]


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


def _register(url: str, admin_token: str, names: list[str], threads: int) -> dict[str, str]:
    """An agent token for each node and its full first report (registers the node and its devices),
    from ``threads`` keep-alive connections."""
    tokens: dict[str, str] = {}
    lock = threading.Lock()

    def worker(i: int) -> None:
        import http.client
        from urllib.parse import urlsplit

        u = urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=60)
        try:
            for n in names[i::threads]:
                conn.request("POST", "/v1/agent-tokens", body=json.dumps({"node": n}).encode(),
                             headers={"Authorization": f"Bearer {admin_token}", "Content-Type": "application/json"})
                r = conn.getresponse()
                tok = json.loads(r.read())["token"]
                conn.request("POST", "/v1/agent/heartbeat", body=json.dumps(_heartbeat(n)).encode(),
                             headers={"Authorization": f"Bearer {tok}", "Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                if r.status >= 300:
                    raise RuntimeError(f"first heartbeat of {n}: HTTP {r.status}")
                with lock:
                    tokens[n] = tok
        finally:
            conn.close()

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if len(tokens) != len(names):
        raise RuntimeError(f"registered {len(tokens)} of {len(names)} agents")
    return tokens


def _load() -> str:
    """The machine's load average (1, 5, 15 min), as ``uptime`` gives it: other work shares the cores."""
    try:
        return "load " + " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "load unknown"


def _cpu_s(root: int | None, tree: bool) -> float:
    """CPU seconds (user + system) of process ``root`` (``tree``: with its descendants alive now) and of
    the children they reaped, from /proc."""
    if root is None:
        return 0.0
    stats: dict[int, tuple[int, float]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (tree or int(d) == root):
            try:
                f = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # utime, stime, and cutime, cstime: a PostgreSQL backend that exited (a connection closed)
            # is counted in its parent's, as long as it lived in the tree
            stats[int(d)] = (int(f[1]), sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK"))
    mine, grew = {root}, tree
    while grew:
        more = {p for p, (ppid, _) in stats.items() if ppid in mine} - mine
        grew, mine = bool(more), mine | more
    return sum(stats[p][1] for p in mine if p in stats)


class _Cpu:
    """The CPU the server's HTTP process and the database server (all its backends) spend per request
    over a stretch of the run, and the cycle process's share of a core: figures the machine's other
    load changes far less than the rates."""

    def __init__(self, server: int, database: int | None) -> None:
        self.server, self.database = server, database
        self.start = (time.perf_counter(), _cpu_s(server, False), _cpu_s(server, True), _cpu_s(database, True))

    def per(self, n: int, what: str) -> str:
        t0, http0, all0, db0 = self.start
        wall = time.perf_counter() - t0
        http, everything, db = _cpu_s(self.server, False) - http0, _cpu_s(self.server, True) - all0, \
            _cpu_s(self.database, True) - db0
        out = f"HTTP process {http / max(n, 1) * 1000:.2f} ms CPU per {what}"
        if self.database is not None:
            out += f", PostgreSQL {db / max(n, 1) * 1000:.2f} ms"
        return out + f", cycle process {(everything - http) / wall:.0%} of a core"


def _backend(report: Report, label: str, db: str | None, database_pid: int | None = None) -> None:
    """Submit throughput and heartbeats at each fleet size on one database (``db`` None: SQLite)."""
    import httpx  # noqa: F401 - LocalCluster's client needs it; fail early, before a server starts

    submit_s, threads = (2.0, 4) if report.quick else (10.0, 8)
    fleets, hb_s = ((40, 200), 4.0) if report.quick else ((1000, 5000), 20.0)
    with tempfile.TemporaryDirectory(prefix="gsched-bench-") as tmp:
        cluster = LocalCluster(Path(tmp), [], cycle_s=1.0, ttl_s=600.0, db=db)
        try:
            cluster.start_server()
            admin = cluster.admin()
            token = cluster.add_user("bench")
            t0 = time.perf_counter()
            tokens = _register(cluster.url, cluster.admin_token(), [f"a{i:04d}" for i in range(max(fleets))], 4)
            report.note("control", f"{label}: {len(tokens)} agents registered in {time.perf_counter() - t0:.0f} s")
            admin.request("POST", "/v1/datasets", {
                "name": "benchdata", "classes": 4, "image_shape": [3, 8, 8], "replicas": 1,
                "shards": [{"index": 0, "bytes": 1000, "sha256": "0" * 64, "samples": 10}]})
            load = _load()
            server_pid = cluster.procs["server"].pid
            n_h, t_h, _ = _hammer(cluster.url, token, submit_s, threads, "GET", "/v1/health")
            cpu = _Cpu(server_pid, database_pid)
            n_s, t_s, lat_s = _hammer(cluster.url, token, submit_s, threads, "POST", "/v1/jobs", {"spec": SPEC})
            rate_s, rate_h = n_s / t_s, n_h / t_h
            report.add(Figure("control", f"{label}: submit throughput ({threads} client threads, {submit_s:.0f} s)",
                              _submits(n_s, t_s, lat_s, cpu, load), f"vs GET /v1/health {rate_h:.0f} req/s: ratio {rate_s / rate_h:.2f}",
                              f"none (a closed loop of {threads} clients: at most {threads} / latency; the capacity "
                              "figure carries the target)", None))
            one = {"a0000": tokens["a0000"]}
            idle = _agents(cluster.url, one, 0.05, 2.0 if report.quick else 5.0, 1)
            for n_agents in fleets:
                mine = {n: tokens[n] for n in sorted(tokens)[:n_agents]}
                load = _load()
                cpu = _Cpu(server_pid, database_pid)
                lat = _agents(cluster.url, mine, 5.0, hb_s, min(max(50, n_agents // 50), n_agents))
                p50, p99 = _pct(lat, 50), _pct(lat, 99)
                offered = n_agents * hb_s / 5.0
                biggest = n_agents == max(fleets)
                report.add(Figure("control", f"{label}: {n_agents} agents heartbeating every 5 s for {hb_s:.0f} s, "
                                  f"{n_s} jobs pending, cycles every 1 s",
                                  f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms ({len(lat)} of {offered:.0f} "
                                  f"heartbeats due; {cpu.per(len(lat), 'heartbeat')}; {load})",
                                  f"vs one agent alone on the same server (cycles running) p99 "
                                  f"{_pct(idle, 99) * 1000:.1f} ms: ratio {p99 / _pct(idle, 99):.1f}",
                                  "p99 <= 50 ms" if biggest else "none (reported beside the target's fleet)",
                                  p99 <= 0.050 if biggest else None))
            _capacity(report, label, cluster.url, token, server_pid, database_pid, submit_s, (rate_s, threads, lat_s), n_s)
        finally:
            cluster.close()


def _submits(n: int, t: float, lat: list[float], cpu: _Cpu, load: str) -> str:
    """A submit run in words: rate, latency, CPU per job (read now: call it right after the run), load."""
    return (f"{n / t:.0f} jobs/s (p50 {_pct(lat, 50) * 1000:.1f} ms, p99 {_pct(lat, 99) * 1000:.1f} ms; "
            f"{n} jobs; {cpu.per(n, 'job')}; {load})")


def _capacity(report: Report, label: str, url: str, token: str, server_pid: int, database_pid: int | None,
              submit_s: float, first: tuple[float, int, list[float]], pending: int) -> None:
    """Submits from 2x and 4x the client threads of the first run (``first``: its rate, threads and
    latencies), after the heartbeat figures (so that those run over the same queue as before): the
    server's capacity is the best rate of the three, with its latency.  The closed loop of the first
    run cannot show it: each client waits for its answer, so its rate is at most clients / latency, and
    a group-committed batch's latency is most of it (PostgreSQL: 8 clients, about 8 ms each).  The
    cycle runs every second over a queue growing past ``pending`` jobs meanwhile, so this is a lower
    bound."""
    rate_1, threads, _ = first
    runs = [first]
    for k in (2 * threads, 4 * threads):
        load = _load()
        cpu = _Cpu(server_pid, database_pid)
        n, t, lat = _hammer(url, token, submit_s, k, "POST", "/v1/jobs", {"spec": SPEC})
        report.add(Figure("control", f"{label}: submit throughput ({k} client threads, {submit_s:.0f} s)",
                          _submits(n, t, lat, cpu, load), f"vs {threads} client threads {rate_1:.0f} jobs/s: "
                          f"ratio {n / t / rate_1:.2f}", "none (the capacity figure carries the target)", None))
        runs.append((n / t, k, lat))
    rate, k, lat = max(runs, key=lambda r: r[0])
    report.add(Figure("control", f"{label}: submit capacity (the best of {threads}, {2 * threads} and {4 * threads} "
                      f"client threads, {pending} jobs queued first)",
                      f"{rate:.0f} jobs/s at {k} client threads (p99 {_pct(lat, 99) * 1000:.1f} ms)",
                      f"vs {threads} client threads: ratio {rate / rate_1:.2f}", ">= 1000 jobs/s", rate >= 1000))


def run(report: Report) -> None:
    _backend(report, "SQLite", None)
    why = unavailable()
    if why is not None:
        for what in ("submit throughput", "heartbeats"):
            report.add(Figure("control", f"PostgreSQL: {what}", f"not measured: {why}", "n/a",
                              ">= 1000 jobs/s" if what.startswith("submit") else "p99 <= 50 ms", None))
        return
    # PostgreSQL's own defaults (fsync, synchronous commit): a 2xx is on disk, as in production
    pg = ThrowawayPostgres(free_port(), durable=True)
    try:
        _backend(report, "PostgreSQL", pg.new_database(), pg.pid())
    finally:
        pg.stop()

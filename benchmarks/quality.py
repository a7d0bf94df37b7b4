"""Section ``quality``: placement quality on real trace slices, replayed by ``scheduler.sim.simulator``.

Cluster and data model (our assumptions, see ``scheduler/sim/simulator.py`` for the mechanics):

- ``philly_5000.csv``: 64 nodes x 8 devices in 4 racks (512 devices);
  ``itp_5000.csv``: 192 nodes x 8 devices in 6 racks (1,536 devices; its demand is ~1,400 devices
  on average over its window, Philly's ~660 but mostly from a few very long jobs);
- data: 40 data sets of 16 shards x 512 MB (8 GB each), 3 replicas placed by ``place_replicas``
  (each copy whole on one node),
  Zipf(1.1) popularity; staged shards stay cached on the node (LRU, 200 GB per node) as the agent
  keeps them; one device per rank; seed 0; cycles every 10 simulated seconds; no failures.

Default policy ``twostage`` against ``fairshare`` (fair-share order, data-blind packing) and ``fifo``.
The ``user`` column is the tenant (Philly's virtual cluster; ITP's source cluster stands in).
"""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.common import Figure, Report
from scheduler.sim.simulator import ClusterSpec, DataSpec, SimResult, load_trace, simulate

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
if not TRACES.is_dir():
    TRACES = Path("/work/shared/traces")

DATA = DataSpec(datasets=40, shards=16, shard_mb=512, zipf=1.1, replicas=3, cache_gb=200)
FULL = [("philly_5000.csv", ClusterSpec(64, 8, 4), None), ("itp_5000.csv", ClusterSpec(192, 8, 6), None)]
QUICK = [("philly_500.csv", ClusterSpec(8, 8, 2), 150), ("itp_500.csv", ClusterSpec(16, 8, 2), 150)]
QUICK_DATA = DataSpec(datasets=8, shards=4, shard_mb=512, zipf=1.1, replicas=2, cache_gb=50)


def run(report: Report) -> None:
    cases = QUICK if report.quick else FULL
    data = QUICK_DATA if report.quick else DATA
    for name, cluster, limit in cases:
        path = TRACES / name
        if not path.is_file():
            report.note("quality", f"{path} is missing: skipped (put ../shared/traces beside the clone)")
            continue
        trace = load_trace(path, limit)
        res: dict[str, SimResult] = {}
        for policy in ("twostage", "fairshare", "fifo"):
            t0 = time.perf_counter()
            res[policy] = simulate(trace, policy, cluster, data, seed=0)
            report.note("quality", f"{name} {policy}: simulated {len(trace)} jobs, {res[policy].cycles} cycles "
                        f"in {time.perf_counter() - t0:.1f} s")
        two, fs, ff = res["twostage"], res["fairshare"], res["fifo"]
        where = f"{name} ({len(trace)} jobs, {cluster.nodes}x{cluster.devices_per_node}, {two.clipped} clipped)"
        report.add(Figure("quality", f"{where} local-read fraction",
                          f"twostage {two.local_fraction:.3f}, fairshare {fs.local_fraction:.3f}, fifo {ff.local_fraction:.3f}",
                          f"twostage/fairshare {_ratio(two.local_fraction, fs.local_fraction)}", ">= 0.95",
                          two.local_fraction >= 0.95))
        report.add(Figure("quality", f"{where} bytes moved",
                          f"twostage {two.bytes_moved / 1e12:.2f} TB, fairshare {fs.bytes_moved / 1e12:.2f} TB, "
                          f"fifo {ff.bytes_moved / 1e12:.2f} TB",
                          f"twostage/fairshare {_ratio(two.bytes_moved, fs.bytes_moved)}", "ratio <= 0.25",
                          two.bytes_moved <= 0.25 * fs.bytes_moved))
        report.add(Figure("quality", f"{where} mean JCT",
                          f"twostage {two.mean_jct_s:.0f} s, fairshare {fs.mean_jct_s:.0f} s, fifo {ff.mean_jct_s:.0f} s",
                          f"twostage/fairshare {_ratio(two.mean_jct_s, fs.mean_jct_s)}", "ratio <= 1.00",
                          two.mean_jct_s <= fs.mean_jct_s))
        report.add(Figure("quality", f"{where} Jain's index",
                          f"twostage {two.jain:.3f}, fairshare {fs.jain:.3f}, fifo {ff.jain:.3f}",
                          f"twostage/fairshare {_ratio(two.jain, fs.jain)}", ">= 0.90", two.jain >= 0.9))


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b else "n/a (baseline is 0)"

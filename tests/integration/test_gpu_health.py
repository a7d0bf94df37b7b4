"""GPU health on a real cluster: an agent with ``--gpus auto`` reads its GPUs through NVML (the fake
module in tests/fake_nvml, first on the agent's PYTHONPATH), and a device that reports a fault is no
longer offered; ``gsched nodes`` says why (agents/devices.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from scheduler.cli.localcluster import NodeSpec
from tests.conftest import TINY_SOURCE, job_toml

pytestmark = pytest.mark.integration

FAKE_NVML = Path(__file__).resolve().parents[1] / "fake_nvml"


def gpus(xid: list[list[int]] | None = None, **second: object) -> str:
    devices = [{"name": "NVIDIA H200", "uuid": f"GPU-{i}", "memory": 150_000_000_000} for i in range(2)]
    devices[1].update(second)
    return json.dumps({"devices": devices, "xid": xid or []})


def test_a_gpu_that_reports_a_fault_is_not_offered_and_nodes_says_why(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    state = tmp_path / "nvml.json"
    state.write_text(gpus())
    path = os.pathsep.join([str(FAKE_NVML), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    c = make_cluster([NodeSpec("g1", gpus="auto")],
                     extra_env={"PYTHONPATH": path, "FAKE_NVML_STATE": str(state)}).start()
    [node] = c.admin().get("/v1/nodes")
    assert (node["devices"], node["device_kind"], node["device_model"], node["unhealthy"]) == (
        2, "cuda", "NVIDIA H200", [])

    state.write_text(gpus(xid=[[1, 79]]))  # device 1 falls off the bus while the agent runs
    node = c.wait_for(lambda: next((n for n in c.admin().get("/v1/nodes") if n["devices"] == 1), None), 30,
                      "the faulty device to be taken out")
    assert node["unhealthy"] == [{"index": 1, "uuid": "GPU-1", "health": "XID 79 (device fault)"}]
    assert node["devices_free"] == 1
    shown = c.cli("nodes").stdout
    assert "device 1: XID 79 (device fault)" in shown and "0/1 cuda" in shown

    # The cluster now has one healthy device on its only node: two per rank cannot be had.
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "1",
          "--replicas", "1")
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("wide", ranks=1, gpus=2, epochs=1))
    refused = c.cli("submit", str(spec), check=False)
    assert refused.returncode != 0 and "gpus_per_rank" in refused.stderr + refused.stdout

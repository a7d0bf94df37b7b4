"""``gsched agent --gpus N|auto``: what the agent reports as its devices, and their health (NVML)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.devices import Devices, detect_devices
from tests.fake_nvml import pynvml as fake_nvml

GIB = 2**30


def gpu(n: int, **health: Any) -> dict[str, Any]:
    return {"name": "NVIDIA H200", "uuid": f"GPU-0000000{n}-aaaa-bbbb-cccc-dddddddddddd", "memory": 141 * GIB,
            **health}


@pytest.fixture
def nvml_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Write the fake NVML's state; returns the writer."""
    path = tmp_path / "nvml.json"
    monkeypatch.setenv("FAKE_NVML_STATE", str(path))

    def write(devices: list[dict[str, Any]], xid: list[list[int]] | None = None, **more: Any) -> None:
        path.write_text(json.dumps({"devices": devices, "xid": xid or [], **more}))
    return write


def test_a_number_declares_that_many_cpu_devices() -> None:
    assert [d["index"] for d in detect_devices("3")] == [0, 1, 2]
    assert {d["kind"] for d in detect_devices("3")} == {"cpu"}
    with pytest.raises(ValueError, match="between 0 and 1024"):
        detect_devices("2000")
    with pytest.raises(ValueError, match="a number or auto, not 'many'"):
        detect_devices("many")


def test_auto_reads_each_gpu_through_nvml(nvml_state) -> None:  # type: ignore[no-untyped-def]
    nvml_state([gpu(0), gpu(1)])
    assert Devices("auto", nvml=fake_nvml).poll() == [
        {"index": 0, "kind": "cuda", "model": "NVIDIA H200", "uuid": "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
         "memory_bytes": 141 * GIB, "healthy": True, "health": ""},
        {"index": 1, "kind": "cuda", "model": "NVIDIA H200", "uuid": "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd",
         "memory_bytes": 141 * GIB, "healthy": True, "health": ""}]


@pytest.mark.parametrize(("health", "reason"), [
    ({"ecc_uncorrected": 2}, "2 uncorrectable ECC errors"),
    ({"ecc_uncorrected": 1}, "1 uncorrectable ECC error"),
    ({"retired_pending": True}, "retired pages pending: needs a GPU reset"),
    ({"remap_pending": True}, "row remapping pending: needs a GPU reset"),
    ({"remap_failed": True}, "row remapping failed"),
])
def test_a_device_with_memory_faults_is_unhealthy_and_says_why(nvml_state, health, reason) -> None:  # type: ignore[no-untyped-def]
    nvml_state([gpu(0), gpu(1, **health)])
    devices = Devices("auto", nvml=fake_nvml).poll()
    assert [(d["healthy"], d["health"]) for d in devices] == [(True, ""), (False, reason)]


def test_a_device_without_ecc_is_not_counted_unhealthy(nvml_state) -> None:  # type: ignore[no-untyped-def]
    nvml_state([gpu(0, ecc_supported=False)])
    assert Devices("auto", nvml=fake_nvml).poll()[0]["healthy"] is True


def test_health_is_looked_at_again_on_every_poll(nvml_state) -> None:  # type: ignore[no-untyped-def]
    nvml_state([gpu(0), gpu(1)])
    devices = Devices("auto", nvml=fake_nvml)
    assert [d["healthy"] for d in devices.poll()] == [True, True]
    nvml_state([gpu(0, ecc_uncorrected=5), gpu(1)])
    assert [d["healthy"] for d in devices.poll()] == [False, True]


def test_a_device_fault_xid_makes_the_device_unhealthy_until_the_agent_restarts(nvml_state) -> None:  # type: ignore[no-untyped-def]
    nvml_state([gpu(0), gpu(1)])
    devices = Devices("auto", nvml=fake_nvml)
    assert [d["healthy"] for d in devices.poll()] == [True, True]
    nvml_state([gpu(0), gpu(1)], xid=[[1, 79]])  # fallen off the bus
    assert [(d["healthy"], d["health"]) for d in devices.poll()] == [(True, ""), (False, "XID 79 (device fault)")]
    # The event was delivered once; the device stays out of service until the agent starts again.
    assert [d["healthy"] for d in devices.poll()] == [True, False]
    assert [d["healthy"] for d in Devices("auto", nvml=fake_nvml).poll()] == [True, True]


def test_an_application_xid_leaves_the_device_healthy(nvml_state) -> None:  # type: ignore[no-untyped-def]
    nvml_state([gpu(0)])
    devices = Devices("auto", nvml=fake_nvml)
    nvml_state([gpu(0)], xid=[[0, 13], [0, 31], [0, 43]])  # a kernel's exception, a page fault, a stopped channel
    assert devices.poll()[0]["healthy"] is True


def test_without_an_nvidia_driver_auto_asks_torch_then_falls_back_to_one_cpu_device(nvml_state) -> None:  # type: ignore[no-untyped-def]
    import torch

    nvml_state([], no_driver=True)
    devices = Devices("auto", nvml=fake_nvml).poll()
    if torch.cuda.is_available():  # a GPU machine: torch's view, one entry per device
        assert len(devices) == torch.cuda.device_count() and {d["kind"] for d in devices} == {"cuda"}
    else:
        assert devices == [{"index": 0, "kind": "cpu", "model": "cpu", "memory_bytes": 0, "healthy": True}]

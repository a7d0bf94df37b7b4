"""``gsched agent --gpus N|auto``: what the agent reports as its devices."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agents.inventory import detect_devices


def test_a_number_declares_that_many_cpu_devices() -> None:
    assert [d["index"] for d in detect_devices("3")] == [0, 1, 2]
    assert {d["kind"] for d in detect_devices("3")} == {"cpu"}
    with pytest.raises(ValueError, match="between 0 and 1024"):
        detect_devices("2000")


def test_auto_reads_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"  # prints what the real one prints for this query on a two-GPU host
    smi.write_text("#!/bin/sh\nprintf '0, NVIDIA H200, 143771\\n1, NVIDIA H200, 143771\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    devices = detect_devices("auto")
    assert [(d["index"], d["kind"], d["model"], d["memory_bytes"]) for d in devices] == [
        (0, "cuda", "NVIDIA H200", 143771 * 2**20), (1, "cuda", "NVIDIA H200", 143771 * 2**20)]


def test_auto_without_nvidia_smi_asks_torch_then_falls_back_to_one_cpu_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    devices = detect_devices("auto")
    if torch.cuda.is_available():  # a GPU machine: torch's view, one entry per device
        assert len(devices) == torch.cuda.device_count() and {d["kind"] for d in devices} == {"cuda"}
    else:
        assert devices == [{"index": 0, "kind": "cpu", "model": "cpu", "memory_bytes": 0, "healthy": True}]

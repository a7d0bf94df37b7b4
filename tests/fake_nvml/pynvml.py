"""A stand-in for nvidia-ml-py's ``pynvml``, for tests on machines without a GPU.

It answers the calls agents/devices.py makes, from a JSON file named by ``FAKE_NVML_STATE``, read
again on every call so a test can change a device's health while an agent runs::

    {"devices": [{"name": "NVIDIA H200", "uuid": "GPU-...", "memory": 150000000000,
                  "ecc_uncorrected": 0, "retired_pending": false, "remap_pending": false,
                  "remap_failed": false, "ecc_supported": true}],
     "xid": [[1, 79]],            # XID events, in order: [device index, xid]
     "no_driver": false}

Put this directory first on ``PYTHONPATH`` (an agent subprocess) or import the module (unit tests).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
nvmlEventTypeXidCriticalError = 0x8

_WORDS = {NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_TIMEOUT: "Timeout",
          NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found"}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _WORDS.get(self.value, f"NVML error {self.value}")


def _state() -> dict[str, Any]:
    with open(os.environ["FAKE_NVML_STATE"]) as f:
        return dict(json.load(f))


def _device(handle: _Handle) -> dict[str, Any]:
    return dict(_state()["devices"][handle.index])


@dataclass(frozen=True)
class _Handle:
    index: int


@dataclass
class _Memory:
    total: int
    free: int
    used: int = 0


@dataclass
class _EventSet:
    delivered: int = 0
    handles: set[int] = field(default_factory=set)


@dataclass
class _Event:
    device: _Handle
    eventType: int
    eventData: int


def nvmlInit() -> None:
    if _state().get("no_driver"):
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return len(_state()["devices"])


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    return _Handle(index)


def nvmlDeviceGetIndex(handle: _Handle) -> int:
    return handle.index


def nvmlDeviceGetName(handle: _Handle) -> str:
    return str(_device(handle)["name"])


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    return str(_device(handle)["uuid"])


def nvmlDeviceGetMemoryInfo(handle: _Handle) -> _Memory:
    total = int(_device(handle)["memory"])
    return _Memory(total=total, free=total)


def nvmlDeviceGetTotalEccErrors(handle: _Handle, error_type: int, counter_type: int) -> int:
    d = _device(handle)
    if not d.get("ecc_supported", True):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(d.get("ecc_uncorrected", 0)) if error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else 0


def nvmlDeviceGetRetiredPagesPendingStatus(handle: _Handle) -> int:
    return NVML_FEATURE_ENABLED if _device(handle).get("retired_pending") else NVML_FEATURE_DISABLED


def nvmlDeviceGetRemappedRows(handle: _Handle) -> tuple[int, int, int, int]:
    d = _device(handle)
    return 0, 0, int(bool(d.get("remap_pending"))), int(bool(d.get("remap_failed")))


def nvmlEventSetCreate() -> _EventSet:
    # As the real one: a set sees only the events that happen after it was made.
    return _EventSet(delivered=len(_state().get("xid", [])))


def nvmlDeviceRegisterEvents(handle: _Handle, event_types: int, event_set: _EventSet) -> None:
    event_set.handles.add(handle.index)


def nvmlEventSetWait(event_set: _EventSet, timeout_ms: int) -> _Event:
    events = _state().get("xid", [])
    while event_set.delivered < len(events):
        index, xid = events[event_set.delivered]
        event_set.delivered += 1
        if index in event_set.handles:
            return _Event(_Handle(int(index)), nvmlEventTypeXidCriticalError, int(xid))
    raise NVMLError(NVML_ERROR_TIMEOUT)

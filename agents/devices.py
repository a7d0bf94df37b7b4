"""The devices a node offers, and whether each is healthy enough to be offered.

``gsched agent --gpus N`` declares N CPU devices (tests, CPU nodes): always healthy.

``--gpus auto`` reads the GPUs through NVML (the ``pynvml`` module of nvidia-ml-py), the library
nvidia-smi itself reads: index, name, UUID, memory, PCI bus id, and health, looked at again on every
heartbeat (a few cheap NVML calls):

- **ECC**: a device with uncorrectable ECC errors since the driver loaded (volatile count) is unhealthy;
- **pages**: retired pages or remapped rows waiting for a GPU reset make it unhealthy until reset;
- **XID**: an XID critical error event that names a device fault (the list below) makes it unhealthy
  until the agent restarts (after an operator has reset or replaced it), as the Kubernetes device plugin
  does. XIDs that are a program's own error (13 graphics engine exception, 31 memory page fault, 43 a
  stopped channel, 45 preemptive cleanup, 68 video decode, 109 context switch timeout) say nothing of the
  device and are ignored.

An unhealthy device is reported with the reason in ``health``; the server does not offer it to new
ranks (running ranks keep it until they end) and ``gsched nodes`` says why. NVML numbers devices in PCI
bus order; the launcher sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` beside ``CUDA_VISIBLE_DEVICES`` so that an
index means the same device to NVML, CUDA and the server.

Without NVML (the library missing, or no driver) ``auto`` asks torch in a child process (the agent
itself never imports torch), else reports one CPU device.
"""

from __future__ import annotations

import importlib
import json
import logging
import subprocess
import sys
from types import ModuleType
from typing import Any

log = logging.getLogger("gsched.agent.devices")

# XIDs of device faults: 48 double-bit ECC, 61/62 internal micro-controller halt, 63/64 page retirement
# or row remapping event/failure, 74 NVLink error, 79 fallen off the bus, 92 high single-bit ECC rate,
# 94/95 contained/uncontained ECC error, 119/120 GSP errors, 140 unrecovered ECC error.
DEVICE_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})


def cpu_devices(n: int) -> list[dict[str, Any]]:
    if not 0 <= n <= 1024:
        raise ValueError("--gpus must be between 0 and 1024, or auto")
    return [{"index": i, "kind": "cpu", "model": "cpu", "memory_bytes": 0, "healthy": True} for i in range(n)]


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlDevices:
    """The GPUs NVML lists, with their health looked at again by each ``poll()``."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        nvml.nvmlInit()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self.static = [self._describe(i, h) for i, h in enumerate(self.handles)]
        self.xid: dict[int, int] = {}  # device index -> the first device-fault XID seen
        self.events: Any = None
        try:
            self.events = nvml.nvmlEventSetCreate()
            for h in self.handles:
                try:
                    nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, self.events)
                except nvml.NVMLError as e:  # e.g. not supported on this device: ECC still counts
                    log.warning("NVML cannot report XID events of a device: %s", e)
        except nvml.NVMLError as e:
            log.warning("NVML gives no event set, XID errors are not watched: %s", e)
            self.events = None

    def _describe(self, index: int, h: Any) -> dict[str, Any]:
        nvml = self.nvml
        return {"index": index, "kind": "cuda", "model": _text(nvml.nvmlDeviceGetName(h))[:128],
                "uuid": _text(nvml.nvmlDeviceGetUUID(h))[:96],
                "memory_bytes": int(nvml.nvmlDeviceGetMemoryInfo(h).total)}

    def _drain_events(self) -> None:
        if self.events is None:
            return
        nvml = self.nvml
        while True:
            try:
                ev = nvml.nvmlEventSetWait(self.events, 0)
            except nvml.NVMLError:  # NVML_ERROR_TIMEOUT: nothing waiting
                return
            xid = int(ev.eventData)
            try:
                index: int | None = int(nvml.nvmlDeviceGetIndex(ev.device))
            except nvml.NVMLError:
                index = None
            if xid not in DEVICE_XIDS:
                log.info("XID %s on device %s is an application's error: the device stays healthy", xid, index)
            elif index is None:
                log.error("XID %s, a device fault, on a device NVML cannot name", xid)
            elif index not in self.xid:
                log.error("device %s: XID %s, a device fault: not offered until the agent restarts", index, xid)
                self.xid[index] = xid

    def _problem(self, index: int, h: Any) -> str:
        nvml = self.nvml
        if index in self.xid:
            return f"XID {self.xid[index]} (device fault)"
        try:
            ecc = int(nvml.nvmlDeviceGetTotalEccErrors(h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                       nvml.NVML_VOLATILE_ECC))
            if ecc > 0:
                return f"{ecc} uncorrectable ECC error{'s' if ecc != 1 else ''}"
        except nvml.NVMLError:  # ECC off or not supported: nothing to count
            pass
        try:
            if nvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == nvml.NVML_FEATURE_ENABLED:
                return "retired pages pending: needs a GPU reset"
        except nvml.NVMLError:
            pass
        try:
            _corr, _unc, pending, failed = nvml.nvmlDeviceGetRemappedRows(h)
            if failed:
                return "row remapping failed"
            if pending:
                return "row remapping pending: needs a GPU reset"
        except nvml.NVMLError:
            pass
        return ""

    def poll(self) -> list[dict[str, Any]]:
        self._drain_events()
        out = []
        for d, h in zip(self.static, self.handles, strict=True):
            try:
                problem = self._problem(d["index"], h)
            except self.nvml.NVMLError as e:  # the device stopped answering at all
                problem = f"NVML: {e}"
            out.append({**d, "healthy": not problem, "health": problem})
        return out


class Devices:
    """What the agent reports each heartbeat: fixed CPU devices, NVML's GPUs, or torch's view."""

    def __init__(self, spec: str, nvml: ModuleType | None = None) -> None:
        self.nvml_devices: NvmlDevices | None = None
        if spec != "auto":
            try:
                n = int(spec)
            except ValueError:
                raise ValueError(f"--gpus must be a number or auto, not {spec!r}") from None
            self.fixed = cpu_devices(n)
            return
        self.fixed = []
        module = nvml if nvml is not None else _import_nvml()
        if module is not None:
            try:
                found = NvmlDevices(module)
                if found.handles:
                    self.nvml_devices = found
                    return
                log.warning("NVML lists no GPU")
            except module.NVMLError as e:
                log.warning("NVML could not start (%s): asking torch", e)
        self.fixed = _torch_cuda_devices()
        if not self.fixed:
            log.warning("--gpus auto found no CUDA device (no NVML, torch.cuda unavailable): one CPU device")
            self.fixed = cpu_devices(1)

    def poll(self) -> list[dict[str, Any]]:
        return self.nvml_devices.poll() if self.nvml_devices is not None else [dict(d) for d in self.fixed]


def detect_devices(spec: str) -> list[dict[str, Any]]:
    """The devices ``--gpus spec`` gives, as of now."""
    return Devices(spec).poll()


def _import_nvml() -> ModuleType | None:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


_TORCH_PROBE = (
    "import json, torch\n"
    "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
    "print(json.dumps([[i, torch.cuda.get_device_name(i), torch.cuda.get_device_properties(i).total_memory]"
    " for i in range(n)]))\n"
)


def _torch_cuda_devices() -> list[dict[str, Any]]:
    """CUDA devices as torch sees them, asked in a child process (importing torch takes seconds and
    hundreds of MB; the agent stays light).  Empty when torch is missing or sees no device."""
    try:
        out = subprocess.run([sys.executable, "-c", _TORCH_PROBE], capture_output=True, text=True, timeout=120,
                             check=True).stdout
        rows = json.loads(out.strip().splitlines()[-1]) if out.strip() else []
        return [{"index": int(i), "kind": "cuda", "model": str(name)[:128], "memory_bytes": int(mem), "healthy": True}
                for i, name, mem in rows]
    except (subprocess.SubprocessError, ValueError, OSError, IndexError) as e:
        log.warning("torch could not list CUDA devices: %s", e)
        return []

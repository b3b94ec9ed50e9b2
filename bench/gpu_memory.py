"""GPU memory of one benchmark row, as a peak: torch's (allocated and reserved, its counters reset
before the row) and the process's as the driver sees it (NVML, through pynvml from nvidia-ml-py,
where installed), which includes what torch does not allocate: nvImageCodec's own pools, CUDA's
context. Sampled while the row runs; a row's figures do not depend on which row ran before it.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

import torch

SAMPLE_S = 0.2  # the driver is asked at most this often


class PeakMemory:
    """Start before a row (``start``), ``sample()`` in its loop, read ``figures()`` after it."""

    def __init__(self, device: int = 0) -> None:
        self.device = device
        self._nvml, self._handle = _nvml_handle(device)
        self._last = 0.0
        self.process_mb: float | None = None
        self.device_mb: float | None = None

    def start(self) -> None:
        gc.collect()  # the last row's loader, its decoders and pools, gone first
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self.process_mb = self.device_mb = None
        self._last = 0.0
        self.sample(force=True)

    def sample(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self._handle is None or (not force and now - self._last < SAMPLE_S):
            return
        self._last = now
        nvml = self._nvml
        used = nvml.nvmlDeviceGetMemoryInfo(self._handle).used / 2**20
        self.device_mb = max(self.device_mb or 0.0, used)
        for process in nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
            if process.pid == os.getpid() and process.usedGpuMemory is not None:
                self.process_mb = max(self.process_mb or 0.0, process.usedGpuMemory / 2**20)

    def figures(self) -> dict[str, Any]:
        self.sample(force=True)
        return {"gpu_peak_allocated_mb": torch.cuda.max_memory_allocated(self.device) / 2**20,
                "gpu_peak_reserved_mb": torch.cuda.max_memory_reserved(self.device) / 2**20,
                "gpu_process_peak_mb": self.process_mb,  # None: NVML absent, or it does not see this pid
                "gpu_device_peak_mb": self.device_mb}


def _nvml_handle(device: int) -> tuple[Any, Any]:
    """pynvml and the handle of torch's ``device`` (matched by UUID), or (None, None)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            found = pynvml.nvmlDeviceGetUUID(handle)
            found = found.decode() if isinstance(found, bytes) else found
            if found.removeprefix("GPU-") == uuid.removeprefix("GPU-"):
                return pynvml, handle
    except Exception:  # noqa: BLE001 - no NVML: torch's figures alone
        return None, None
    return None, None

"""GPU state, board energy and clock stability from NVML, for timing verified GPU paths.

Everything here degrades to a plain reason where NVML or an NVIDIA GPU is missing: the public
functions return ``{"available": False, "reason": ...}`` or ``"not measurable here: ..."`` answers
and never raise for that. ``pynvml`` (package ``nvidia-ml-py``) is imported inside functions only.

Device index: ``index`` is the NVML index, which follows PCI bus order. CUDA numbers devices
fastest-first and honours ``CUDA_VISIBLE_DEVICES``; NVML does neither. Set
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and map through ``CUDA_VISIBLE_DEVICES`` when the two must agree.

Energy: the total-energy counter (mJ, Volta and newer) read on entering and leaving a ``Sampler`` is
preferred; otherwise power samples are integrated (trapezoid). NVML's board power is itself averaged
by the driver (about 1 s on recent GPUs), so the fallback smooths short windows.

Clock-lock rule (NVML has no getter for ``nvidia-smi -lgc`` settings, only setters):
  * fewer than 2 SM clock samples            -> locked None (cannot tell);
  * the SM clock moved during the window     -> locked False;
  * the SM clock held one value throughout, and that value equals the applications clock, or NVML
    reported the "applications clocks setting" clock event reason during the window -> locked True;
  * held one value with neither confirmation -> locked None (a GPU boosting steadily, or idling,
    looks the same as a locked one).
A ``warning`` accompanies every answer other than True on a machine where the GPU was sampled.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Self

NOT_LOCKED_WARNING = (
    "GPU clocks are not locked: timings may vary with boost clocks; lock them with nvidia-smi -lgc for stable numbers"
)
REASON_GPU_IDLE = 0x1  # nvmlClocksEventReasonGpuIdle
REASON_APPLICATIONS_CLOCKS = 0x2  # nvmlClocksEventReasonApplicationsClocksSetting
MIB = 1024 * 1024


class _Unavailable(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _open(index: int):
    """``(pynvml, handle)`` with NVML initialised, or raise ``_Unavailable`` with the reason."""
    try:
        import pynvml
    except ImportError:
        raise _Unavailable("nvidia-ml-py not installed (pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        missing = (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded)
        raise _Unavailable(f"NVML: {e} (no NVIDIA driver here)" if isinstance(e, missing) else f"NVML: {e}") from None
    try:
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError as e:
        _close(pynvml)
        raise _Unavailable(f"NVML: no GPU at NVML index {index} ({e})") from None


def _close(pynvml) -> None:
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pass


def _query(pynvml, name: str, *args):
    """``pynvml.<name>(*args)``, or None where this driver or GPU does not support it."""
    fn = getattr(pynvml, name, None)
    if fn is None:
        return None
    errors = (pynvml.NVMLError, getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError))
    try:
        return fn(*args)
    except errors:
        return None


def _applications_sm_mhz(pynvml, handle):
    clock = _query(pynvml, "nvmlDeviceGetClock", handle, pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_ID_APP_CLOCK_TARGET)
    return (
        clock if clock is not None else _query(pynvml, "nvmlDeviceGetApplicationsClock", handle, pynvml.NVML_CLOCK_SM)
    )


def _clock_event_reasons(pynvml, handle):
    reasons = _query(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    return reasons if reasons is not None else _query(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)


def gpu_state(index: int = 0) -> dict:
    """A snapshot of GPU ``index`` (NVML / PCI bus order, see the module docstring).

    ``{"available": True, "name", "driver", "compute_capability": "9.0", "clocks": {"sm_mhz", "mem_mhz",
    "max_sm_mhz", "max_mem_mhz", "applications_sm_mhz"}, "power_limit_w", "temperature_c", "pstate": "P0",
    "memory": {"total_mb", "used_mb"}}``; any single value is None where NVML does not report it.
    Without NVML or a GPU: ``{"available": False, "reason": "..."}``.
    """
    try:
        pynvml, h = _open(index)
    except _Unavailable as e:
        return {"available": False, "reason": e.reason}
    try:

        def q(name, *args):
            return _query(pynvml, name, h, *args)

        sm, mem = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
        cc = q("nvmlDeviceGetCudaComputeCapability")
        limit_mw = q("nvmlDeviceGetEnforcedPowerLimit")
        pstate = q("nvmlDeviceGetPerformanceState")
        memory = q("nvmlDeviceGetMemoryInfo")
        return {
            "available": True,
            "name": q("nvmlDeviceGetName"),
            "driver": _query(pynvml, "nvmlSystemGetDriverVersion"),
            "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
            "clocks": {
                "sm_mhz": q("nvmlDeviceGetClockInfo", sm),
                "mem_mhz": q("nvmlDeviceGetClockInfo", mem),
                "max_sm_mhz": q("nvmlDeviceGetMaxClockInfo", sm),
                "max_mem_mhz": q("nvmlDeviceGetMaxClockInfo", mem),
                "applications_sm_mhz": _applications_sm_mhz(pynvml, h),
            },
            "power_limit_w": limit_mw / 1000 if limit_mw is not None else None,
            "temperature_c": q("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU),
            "pstate": f"P{pstate}" if pstate is not None and pstate < 32 else None,  # 32 = unknown
            "memory": {"total_mb": memory.total / MIB, "used_mb": memory.used / MIB} if memory else None,
        }
    finally:
        _close(pynvml)


def _sampling_rate(times: list[float]) -> float | None:
    """Samples per second measured from the timestamps themselves."""
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (len(times) - 1) / (times[-1] - times[0])


def _energy_from_samples(times: list[float], watts: list[float]) -> dict | None:
    """Trapezoid integral of power samples: ``{"joules", "window_s", "mean_power_w", "samples",
    "sampling_hz"}``, or None with fewer than 2 samples or no elapsed time."""
    if len(times) != len(watts):
        raise ValueError("times and watts differ in length")
    rate = _sampling_rate(times)
    if rate is None:
        return None
    joules = sum((t1 - t0) * (w0 + w1) / 2 for t0, t1, w0, w1 in zip(times, times[1:], watts, watts[1:]))
    window = times[-1] - times[0]
    return {
        "joules": joules,
        "window_s": window,
        "mean_power_w": joules / window,
        "samples": len(times),
        "sampling_hz": rate,
    }


def _clock_lock_rule(
    sm_mhz: list[int], applications_sm_mhz: int | None = None, event_reasons: int | None = None
) -> tuple[bool | None, str]:
    """``(locked, evidence)`` from sampled SM clocks, the applications clock and the OR of the clock
    event reasons seen while sampling; the rule is in the module docstring."""
    n = len(sm_mhz)
    if n < 2:
        return None, f"only {n} SM clock sample(s): cannot tell whether clocks are locked"
    low, high = min(sm_mhz), max(sm_mhz)
    if low != high:
        return False, f"SM clock moved between {low} and {high} MHz over {n} samples"
    held = f"SM clock held at {low} MHz for all {n} samples"
    if event_reasons is not None and event_reasons & REASON_APPLICATIONS_CLOCKS:
        return True, f"{held}; NVML reported the applications-clocks-setting clock event reason"
    if applications_sm_mhz is not None and low == applications_sm_mhz:
        return True, f"{held}, equal to the applications clock"
    if event_reasons is not None and event_reasons & REASON_GPU_IDLE:
        return None, f"{held}, but the GPU was idle, so a steady clock proves nothing"
    return None, f"{held}, but no NVML setting confirms a lock (steady boost looks the same)"


class Sampler:
    """Samples board power (W), SM clock (MHz) and one process's GPU memory (MiB) in a daemon thread.

    ``with Sampler() as s: <run calls>`` then ``s.summary(calls)``. ``index`` is the NVML index,
    ``pid`` defaults to this process. Process memory comes from NVML's running compute processes and
    is None where NVML does not report it (e.g. a container whose pids differ from the host's).
    """

    def __init__(self, index: int = 0, pid: int | None = None, interval_s: float = 0.01):
        self.index = index
        self.pid = os.getpid() if pid is None else pid
        self.interval_s = interval_s
        self.reason: str | None = None  # why nothing can be measured, once known
        self.times: list[float] = []
        self.watts: list[float | None] = []
        self.sm_mhz: list[int | None] = []
        self.memory_mb: list[float | None] = []
        self.event_reasons: int | None = None
        self.applications_sm_mhz: int | None = None
        self._energy: list[tuple[float, int | None]] = []  # (time, total energy in mJ) at enter and exit
        self._pynvml: Any = None
        self._handle: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def __enter__(self) -> Self:
        try:
            self._pynvml, self._handle = _open(self.index)
        except _Unavailable as e:
            self.reason = e.reason
            return self
        self.applications_sm_mhz = _applications_sm_mhz(self._pynvml, self._handle)
        self._read_energy()
        self._thread = threading.Thread(target=self._run, name="parity-gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pynvml is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()  # close the window at the same moment as the energy counter
        self._read_energy()
        _close(self._pynvml)
        self._pynvml = None

    def _read_energy(self) -> None:
        mj = _query(self._pynvml, "nvmlDeviceGetTotalEnergyConsumption", self._handle)  # Volta and newer
        self._energy.append((time.perf_counter(), mj))

    def _run(self) -> None:
        try:
            while True:
                self._sample()
                if self._stop.wait(self.interval_s):
                    return
        except Exception as e:  # noqa: BLE001 - a failing sampler stays quiet; summary() uses what it got
            self.reason = f"sampling stopped: {e!r}"

    def _sample(self) -> None:
        nv, h = self._pynvml, self._handle
        t = time.perf_counter()
        mw = _query(nv, "nvmlDeviceGetPowerUsage", h)
        sm = _query(nv, "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM)
        reasons = _clock_event_reasons(nv, h)
        used = None
        for proc in _query(nv, "nvmlDeviceGetComputeRunningProcesses", h) or ():
            if proc.pid == self.pid and proc.usedGpuMemory is not None:
                used = proc.usedGpuMemory / MIB
        if reasons is not None:
            self.event_reasons = (self.event_reasons or 0) | reasons
        self.times.append(t)
        self.watts.append(mw / 1000 if mw is not None else None)
        self.sm_mhz.append(sm)
        self.memory_mb.append(used)

    def summary(self, calls: int) -> dict:
        """Energy per inference over the ``with`` block (``calls`` inferences ran in it), clock
        stability and peak process memory; see the module docstring for the clock rule."""
        if calls < 1:
            raise ValueError(f"calls must be at least 1, got {calls}")
        memory = [m for m in self.memory_mb if m is not None]
        return {
            "energy": self._energy_summary(calls),
            "clocks": self._clock_summary(),
            "peak_process_memory_mb": max(memory) if memory else None,
        }

    def _energy_summary(self, calls: int) -> dict:
        if not self.times:
            return {
                "joules_per_inference": None,
                "reason": f"not measurable here: {self.reason or 'the sampler was never started'}",
            }
        powered = [(t, w) for t, w in zip(self.times, self.watts) if w is not None]
        times, watts = [t for t, _ in powered], [w for _, w in powered]
        (t0, mj0), (t1, mj1) = self._energy if len(self._energy) == 2 else ((0.0, None), (0.0, None))
        if mj0 is not None and mj1 is not None and mj1 > mj0 and t1 > t0:
            joules, window = (mj1 - mj0) / 1000, t1 - t0
            return {
                "joules_per_inference": joules / calls,
                "joules": joules,
                "method": "NVML total energy counter",
                "sampling_hz": _sampling_rate(times),
                "samples": len(times),
                "mean_power_w": joules / window,
                "window_s": window,
            }
        integral = _energy_from_samples(times, watts)
        if integral is None:
            why = f"no NVML energy counter reading and {len(times)} power sample(s); at least 2 are needed"
            return {"joules_per_inference": None, "reason": f"not measurable here: {why}"}
        return {
            "joules_per_inference": integral["joules"] / calls,
            "joules": integral["joules"],
            "method": "NVML power samples (trapezoid)",
            "sampling_hz": integral["sampling_hz"],
            "samples": integral["samples"],
            "mean_power_w": integral["mean_power_w"],
            "window_s": integral["window_s"],
        }

    def _clock_summary(self) -> dict:
        sm = [c for c in self.sm_mhz if c is not None]
        if not self.times:
            return {
                "sm_mhz_min": None,
                "sm_mhz_max": None,
                "locked": None,
                "locked_evidence": f"not measurable here: {self.reason or 'the sampler was never started'}",
                "warning": None,
            }
        locked, evidence = _clock_lock_rule(sm, self.applications_sm_mhz, self.event_reasons)
        return {
            "sm_mhz_min": min(sm) if sm else None,
            "sm_mhz_max": max(sm) if sm else None,
            "locked": locked,
            "locked_evidence": evidence,
            "warning": None if locked else NOT_LOCKED_WARNING,
        }

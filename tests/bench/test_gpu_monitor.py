"""GPU monitor: honest "not measurable here" answers without a GPU, and the energy and clock arithmetic."""

from __future__ import annotations

import os
import sys
import time
import types

import pytest

from parity.bench.gpu import NOT_LOCKED_WARNING, Sampler, _clock_lock_rule, _energy_from_samples, gpu_state

HAS_GPU = gpu_state()["available"]


def _no_nvml_library(monkeypatch):
    """Make NVML fail as it does on a machine without the NVIDIA driver."""
    pynvml = pytest.importorskip("pynvml")

    def fail():
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", fail)


def _assert_not_measurable(summary):
    energy = summary["energy"]
    assert energy["joules_per_inference"] is None
    assert energy["reason"].startswith("not measurable here")
    assert set(energy) == {"joules_per_inference", "reason"}
    assert summary["clocks"]["locked"] is None
    assert summary["clocks"]["warning"] is None
    assert summary["peak_process_memory_mb"] is None


# --- without a GPU -------------------------------------------------------------------------------


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_gpu_state_without_gpu_gives_reason(capfd):
    state = gpu_state()
    assert state["available"] is False
    assert "NVML" in state["reason"] or "nvidia-ml-py" in state["reason"]
    assert capfd.readouterr() == ("", "")


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_sampler_without_gpu_is_not_measurable(capfd):
    with Sampler(interval_s=0.005) as sampler:
        time.sleep(0.05)
    summary = sampler.summary(10)
    _assert_not_measurable(summary)
    assert "NVML" in summary["energy"]["reason"] or "nvidia-ml-py" in summary["energy"]["reason"]
    assert capfd.readouterr() == ("", "")


def test_missing_nvml_library_reason(monkeypatch):
    _no_nvml_library(monkeypatch)
    state = gpu_state()
    assert state == {"available": False, "reason": "NVML: NVML Shared Library Not Found (no NVIDIA driver here)"}
    with Sampler() as sampler:
        time.sleep(0.02)
    summary = sampler.summary(10)
    _assert_not_measurable(summary)
    assert summary["energy"]["reason"] == (
        "not measurable here: NVML: NVML Shared Library Not Found (no NVIDIA driver here)"
    )


def test_missing_package_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    assert gpu_state() == {"available": False, "reason": "nvidia-ml-py not installed (pip install nvidia-ml-py)"}
    with Sampler() as sampler:
        pass
    _assert_not_measurable(sampler.summary(1))


def test_summary_needs_a_call():
    with pytest.raises(ValueError):
        Sampler().summary(0)


# --- pure arithmetic ---------------------------------------------------------------------------


def test_trapezoid_constant_power():
    times = [i * 0.1 for i in range(11)]  # 10 Hz over 1 s
    result = _energy_from_samples(times, [100.0] * 11)
    assert result["joules"] == pytest.approx(100.0)
    assert result["window_s"] == pytest.approx(1.0)
    assert result["mean_power_w"] == pytest.approx(100.0)
    assert result["sampling_hz"] == pytest.approx(10.0)
    assert result["samples"] == 11


def test_trapezoid_ramp_and_uneven_timestamps():
    # power rises linearly 0 -> 100 W over 2 s: exactly 100 J for any sampling of a straight line
    times = [0.0, 0.1, 0.5, 0.6, 1.7, 2.0]
    result = _energy_from_samples(times, [50.0 * t for t in times])
    assert result["joules"] == pytest.approx(100.0)
    assert result["sampling_hz"] == pytest.approx(5 / 2.0)  # rate from the timestamps, not the interval asked


def test_trapezoid_too_few_samples():
    assert _energy_from_samples([], []) is None
    assert _energy_from_samples([1.0], [90.0]) is None
    assert _energy_from_samples([1.0, 1.0], [90.0, 90.0]) is None
    with pytest.raises(ValueError):
        _energy_from_samples([0.0, 1.0], [1.0])


def test_clock_rule_varying_clock_is_not_locked():
    locked, evidence = _clock_lock_rule([1980, 1965, 1980], applications_sm_mhz=1980, event_reasons=0x2)
    assert locked is False
    assert "1965" in evidence and "1980" in evidence


def test_clock_rule_pinned_and_confirmed_is_locked():
    locked, evidence = _clock_lock_rule([1410] * 30, applications_sm_mhz=1410)
    assert locked is True and "applications clock" in evidence
    locked, evidence = _clock_lock_rule([1200] * 30, applications_sm_mhz=1755, event_reasons=0x2)
    assert locked is True and "applications-clocks-setting" in evidence


def test_clock_rule_steady_but_unconfirmed_is_unknown():
    locked, evidence = _clock_lock_rule([1980] * 30, applications_sm_mhz=1755, event_reasons=0x0)
    assert locked is None and "no NVML setting" in evidence
    locked, evidence = _clock_lock_rule([345] * 30, applications_sm_mhz=1755, event_reasons=0x1)
    assert locked is None and "idle" in evidence


def test_clock_rule_too_few_samples():
    assert _clock_lock_rule([])[0] is None
    assert _clock_lock_rule([1410], applications_sm_mhz=1410)[0] is None


# --- the whole sampler against a stand-in NVML -------------------------------------------------


class _FakeNVMLError(Exception):
    pass


def _fake_pynvml(watts=250.0, sm=(1410,), app_clock=1410, reasons=0x2, energy_counter=True, memory_mib=512):
    """A stand-in for the pynvml module: constant power, SM clocks cycling through ``sm``."""
    start = time.perf_counter()
    clocks = iter(sm * 10_000)

    def not_supported(*_):
        raise _FakeNVMLError("Not Supported")

    fake = types.SimpleNamespace(
        NVMLError=_FakeNVMLError,
        NVMLError_LibraryNotFound=_FakeNVMLError,
        NVMLError_DriverNotLoaded=_FakeNVMLError,
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_CLOCK_ID_APP_CLOCK_TARGET=1,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: object(),
        nvmlDeviceGetPowerUsage=lambda h: int(watts * 1000),
        nvmlDeviceGetClockInfo=lambda h, kind: next(clocks),
        nvmlDeviceGetClock=lambda h, kind, clock_id: app_clock,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: reasons,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=memory_mib * 1024 * 1024),
            types.SimpleNamespace(pid=-1, usedGpuMemory=None),
        ],
        nvmlDeviceGetTotalEnergyConsumption=(
            (lambda h: int((time.perf_counter() - start) * watts * 1000)) if energy_counter else not_supported
        ),
    )
    return fake


def test_sampler_prefers_energy_counter(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    with Sampler(interval_s=0.005) as sampler:
        time.sleep(0.2)
    summary = sampler.summary(20)
    energy = summary["energy"]
    assert energy["method"] == "NVML total energy counter"
    assert energy["mean_power_w"] == pytest.approx(250.0, rel=0.05)
    assert energy["joules_per_inference"] == pytest.approx(energy["joules"] / 20)
    assert energy["joules"] == pytest.approx(250.0 * energy["window_s"], rel=0.05)
    assert energy["samples"] >= 3 and energy["sampling_hz"] > 0
    assert summary["clocks"] == {
        "sm_mhz_min": 1410,
        "sm_mhz_max": 1410,
        "locked": True,
        "locked_evidence": summary["clocks"]["locked_evidence"],
        "warning": None,
    }
    assert summary["peak_process_memory_mb"] == pytest.approx(512.0)


def test_sampler_falls_back_to_power_samples(monkeypatch):
    fake = _fake_pynvml(watts=80.0, sm=(1980, 1965), app_clock=1755, reasons=0, energy_counter=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with Sampler(interval_s=0.005) as sampler:
        time.sleep(0.1)
    summary = sampler.summary(4)
    energy = summary["energy"]
    assert energy["method"] == "NVML power samples (trapezoid)"
    assert energy["mean_power_w"] == pytest.approx(80.0)
    assert energy["joules"] == pytest.approx(80.0 * energy["window_s"])
    assert 0.09 < energy["window_s"] < 1.0
    assert energy["sampling_hz"] == pytest.approx((energy["samples"] - 1) / energy["window_s"])
    clocks = summary["clocks"]
    assert (clocks["sm_mhz_min"], clocks["sm_mhz_max"], clocks["locked"]) == (1965, 1980, False)
    assert clocks["warning"] == NOT_LOCKED_WARNING


def test_sampler_without_power_or_counter_is_not_measurable(monkeypatch):
    fake = _fake_pynvml(energy_counter=False)
    fake.nvmlDeviceGetPowerUsage = fake.nvmlDeviceGetTotalEnergyConsumption  # raises Not Supported
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with Sampler(interval_s=0.005) as sampler:
        time.sleep(0.03)
    energy = sampler.summary(10)["energy"]
    assert energy["joules_per_inference"] is None
    assert energy["reason"].startswith("not measurable here")


# --- on a GPU ----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="no NVIDIA GPU visible to NVML")
def test_sampler_on_gpu():
    state = gpu_state()
    assert state["name"] and state["driver"]
    with Sampler(interval_s=0.01) as sampler:
        time.sleep(0.3)
    summary = sampler.summary(1)
    energy, clocks = summary["energy"], summary["clocks"]
    assert energy["joules_per_inference"] > 0, energy
    assert energy["method"] in ("NVML total energy counter", "NVML power samples (trapezoid)")
    assert 0 < energy["mean_power_w"] < 2000
    assert energy["samples"] >= 2 and energy["sampling_hz"] > 1
    assert 0 < clocks["sm_mhz_min"] <= clocks["sm_mhz_max"]
    max_sm = state["clocks"]["max_sm_mhz"]
    assert max_sm is None or clocks["sm_mhz_max"] <= max_sm
    assert clocks["locked"] in (True, False, None) and clocks["locked_evidence"]
    assert (clocks["warning"] is None) == (clocks["locked"] is True)

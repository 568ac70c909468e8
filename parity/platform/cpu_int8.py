"""The CPU's int8 matrix-multiply kernel in ONNX Runtime, and the quantizer setting ONNX Runtime advises for it.

ONNX Runtime's CPU kernels (MLAS) pick their u8 x s8 matrix product by CPUID alone (``core/mlas/lib/platform.cpp``);
no session option or environment variable chooses another. On x86 a QDQ model's int8 activations run as uint8 (its
``QDQS8ToU8Transformer``), so every int8 MatMul, Gemm and Conv is a u8 x s8 product, summed:

- with VNNI (AVX-512 VNNI, AVX-VNNI) or AMX-INT8: in 32 bits (``VPDPBUSD``), exactly;
- with AVX2, or AVX-512 without VNNI: each pair of neighbouring products by ``VPMADDUBSW`` into a *saturating* 16-bit
  lane first, so 2 x 255 x 127 = 64,770 is clipped to 32,767 and a layer's sum can be silently off;
- elsewhere (ARM64, x86 without AVX2): products widened before they are added, exactly.

ONNX Runtime's quantization guide names the remedy for the saturating kernels: ``reduce_range``, weights quantized
to 7 bits (at most 64 in magnitude: 2 x 255 x 64 = 32,640 fits the 16-bit lane), so the sums are exact on every
kernel and an int8 model computes the same integers on an AVX2, an AVX-512 and a VNNI machine.

``PARITY_INT8_CPU`` (one of ``KINDS``) quantizes for another CPU than this one, e.g. the AVX2 servers a model is
deployed on. The standard library only.
"""

from __future__ import annotations

import os
import platform

from parity.platform.errors import UsageError

VARIABLE = "PARITY_INT8_CPU"
PAIR_LIMIT = 32767  # the 16-bit lane VPMADDUBSW saturates to
# kind -> (what it is, whether its u8 x s8 kernel saturates 16-bit pair sums)
KINDS = {
    "avx2": ("x86-64 AVX2 without VNNI: u8 x s8 pair sums saturate at 16 bits (VPMADDUBSW)", True),
    "avx512": ("x86-64 AVX-512 without VNNI: u8 x s8 pair sums saturate at 16 bits (VPMADDUBSW)", True),
    "vnni": ("x86-64 with VNNI: u8 x s8 sums in 32 bits (VPDPBUSD)", False),
    "amx": ("x86-64 with AMX-INT8: int8 sums in 32 bits", False),
    "x86": ("x86-64 without AVX2: u8 x s8 products widened to 16 bits before they are added", False),
    "arm64": ("ARM64: int8 products widened (or dot products) before they are added", False),
    "unknown-x86": ("x86-64 whose features could not be read: taken as AVX2, which holds on every x86 CPU", True),
    "other": ("not x86: int8 products widened before they are added", False),
}


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags as Linux lists them (``/proc/cpuinfo``), or None where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def kind_of(machine: str, flags: set[str] | None) -> str:
    """The int8 kernel kind (a key of ``KINDS``) MLAS picks on a CPU of architecture ``machine`` with ``flags``
    (Linux's names), by the checks of its ``platform.cpp``."""
    machine = machine.lower()
    if machine in ("aarch64", "arm64"):
        return "arm64"
    if machine not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return "other"
    if flags is None:
        return "unknown-x86"
    if "avx2" not in flags:
        return "x86"
    if {"amx_int8", "amx_tile"} <= flags:
        return "amx"
    avx512_core = {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags
    if "avx_vnni" in flags or (avx512_core and "avx512_vnni" in flags):
        return "vnni"
    return "avx512" if avx512_core else "avx2"


def int8_cpu() -> dict:
    """``{"kind", "cpu", "saturates", "source"}``: this CPU's int8 kernel kind (or the one ``PARITY_INT8_CPU``
    names), what it is, and whether its u8 x s8 pair sums saturate. A ``PARITY_INT8_CPU`` that names no kind is a
    ``UsageError``."""
    forced = os.environ.get(VARIABLE, "").strip().lower()
    if forced and forced != "auto":
        if forced not in KINDS:
            raise UsageError(f"{VARIABLE}={forced!r} is not one of auto, {', '.join(KINDS)}")
        kind, source = forced, f"{VARIABLE}={forced}"
    else:
        kind, source = kind_of(platform.machine(), cpu_flags()), "this CPU"
    what, saturates = KINDS[kind]
    return {"kind": kind, "cpu": what, "saturates": saturates, "source": source}


def ort_settings(cpu: dict) -> dict:
    """The quantizer settings ONNX Runtime advises for ``cpu`` (``int8_cpu()``): ``reduce_range`` (7-bit weights)
    where its u8 x s8 kernel saturates, the full 8 bits elsewhere; with the reason, for the record."""
    if cpu["saturates"]:
        return {
            "reduce_range": True,
            "why": f"{cpu['kind']} ({cpu['source']}): weights in 7 bits so no pair sum can saturate, as ONNX "
            "Runtime's quantization guide advises for CPUs without VNNI",
        }
    return {"reduce_range": False, "why": f"{cpu['kind']} ({cpu['source']}): int8 sums are exact, weights in 8 bits"}

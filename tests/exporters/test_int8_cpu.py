"""ONNX Runtime's int8 paths on every kind of CPU: the kernel kind MLAS picks, the quantizer setting that follows,
and proof on the quantized model's own integers that the setting keeps the AVX2 kernel's 16-bit pair sums exact.

MLAS picks its kernel by CPUID alone (no session option or variable forces another), so the AVX2 kernel cannot be run
on a VNNI machine: its arithmetic (each pair of u8 x s8 products summed by VPMADDUBSW into a saturating 16-bit lane) is
computed here in NumPy on the integers ONNX Runtime's quantizer wrote. With ``reduce_range`` no pair can saturate, so
every kernel computes the same sums and a test that passes on one CPU passes on the others.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from parity.exporters import onnx_int8
from parity.platform import cpu_int8
from parity.platform.errors import ExportError, UsageError
from tests.diagnose.precision.test_int8_ort import _jax_style_gemm

AVX512 = {"avx2", "avx512f", "avx512bw", "avx512dq", "avx512vl"}


@pytest.mark.parametrize(
    ("machine", "flags", "kind", "saturates"),
    [
        ("x86_64", {"sse4_1", "avx", "avx2", "fma"}, "avx2", True),  # the AMD EPYC the zoo's int8 gate failed on
        ("x86_64", {"avx2", "avx512f"}, "avx2", True),  # AVX-512F alone: MLAS keeps the AVX2 int8 kernel
        ("x86_64", AVX512, "avx512", True),
        ("x86_64", AVX512 | {"avx512_vnni"}, "vnni", False),
        ("x86_64", {"avx2", "avx_vnni"}, "vnni", False),
        ("x86_64", AVX512 | {"avx512_vnni", "amx_tile", "amx_int8"}, "amx", False),
        ("x86_64", {"sse4_1"}, "x86", False),
        ("x86_64", None, "unknown-x86", True),
        ("aarch64", None, "arm64", False),
    ],
)
def test_the_int8_kernel_kind_follows_mlas_cpuid_checks(machine, flags, kind, saturates):
    assert cpu_int8.kind_of(machine, flags) == kind
    assert cpu_int8.KINDS[kind][1] is saturates
    assert cpu_int8.ort_settings({"kind": kind, "saturates": saturates, "source": "this CPU"})["reduce_range"] is (
        saturates
    )


def test_parity_int8_cpu_names_the_kind_or_is_a_usage_error(monkeypatch):
    monkeypatch.setenv(cpu_int8.VARIABLE, "AVX2")
    assert cpu_int8.int8_cpu() == {
        "kind": "avx2",
        "cpu": cpu_int8.KINDS["avx2"][0],
        "saturates": True,
        "source": "PARITY_INT8_CPU=avx2",
    }
    monkeypatch.setenv(cpu_int8.VARIABLE, "avx3")
    with pytest.raises(UsageError, match="PARITY_INT8_CPU='avx3' is not one of auto, avx2, avx512, vnni"):
        cpu_int8.int8_cpu()
    monkeypatch.setenv(cpu_int8.VARIABLE, "auto")
    assert cpu_int8.int8_cpu()["source"] == "this CPU"


def _pair_sums(model, x) -> np.ndarray:
    """The u8 x s8 pair sums (int64, unclipped) an x86 kernel forms for the first Gemm of ``model`` (QDQ) on ``x``:
    the activation quantized as its QuantizeLinear says and shifted to uint8 (ONNX Runtime runs int8 QDQ activations
    as uint8 on x86), times the int8 weights, neighbouring input channels summed in pairs."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producer = {out: node for node in model.graph.node for out in node.output}
    gemm = next(node for node in model.graph.node if node.op_type == "Gemm")
    dq_x, dq_w = producer[gemm.input[0]], producer[gemm.input[1]]
    q_x = producer[dq_x.input[0]]
    scale, zero = inits[q_x.input[1]], inits[q_x.input[2]]
    xq = np.clip(np.round(x / scale) + zero.astype(np.int64), -128, 127).astype(np.int64)
    u = xq + 128
    w = inits[dq_w.input[0]].astype(np.int64)  # (K, N): the graph's Gemm has transB=0
    return u[:, 0::2, None] * w[None, 0::2, :] + u[:, 1::2, None] * w[None, 1::2, :]


@pytest.mark.parametrize("kind", ["avx2", "avx512", "vnni"])
def test_each_cpu_kind_gets_weights_its_int8_kernel_sums_exactly(tmp_path, monkeypatch, kind):
    monkeypatch.setenv(cpu_int8.VARIABLE, kind)
    _jax_style_gemm(tmp_path / "f.onnx")
    x = np.random.default_rng(1).normal(size=(8, 16)).astype(np.float32)
    record = onnx_int8.quantize(tmp_path / "f.onnx", tmp_path / "q.onnx", [{"x": x}], "MinMax")
    saturating = kind != "vnni"
    assert record["reduce_range"] is saturating and record["int8_cpu"]["kind"] == kind
    assert record["int8_cpu"]["source"] == f"PARITY_INT8_CPU={kind}"
    sums = _pair_sums(onnx.load(str(tmp_path / "q.onnx")), x)
    if saturating:  # 7-bit weights: no pair of products can leave the 16-bit lane, on any input
        assert record["u8s8_pair_bound"] == 2 * 255 * 64 <= cpu_int8.PAIR_LIMIT
        assert np.abs(sums).max() <= cpu_int8.PAIR_LIMIT
    else:  # 8-bit weights: the AVX2 kernel would clip these sums; VNNI adds them in 32 bits
        assert record["u8s8_pair_bound"] == 2 * 255 * 127 > cpu_int8.PAIR_LIMIT
        assert np.abs(sums).max() > cpu_int8.PAIR_LIMIT


def test_a_graph_whose_nodes_have_no_names_is_named_and_quantized(tmp_path):
    _jax_style_gemm(tmp_path / "named.onnx")
    model = onnx.load(str(tmp_path / "named.onnx"))
    for node in model.graph.node:
        node.name = ""
    onnx.save(model, str(tmp_path / "f.onnx"))
    x = np.random.default_rng(1).normal(size=(8, 16)).astype(np.float32)
    record = onnx_int8.quantize(tmp_path / "f.onnx", tmp_path / "q.onnx", [{"x": x}], "MinMax")
    assert record["quantized_layers"] >= 2 and "Gemm_0" in record["pre_process"]["nodes_named"]
    names = [node.name for node in onnx.load(str(tmp_path / "q.onnx")).graph.node]
    assert all(names) and len(set(names)) == len(names)
    assert (
        onnx_int8.quantize(tmp_path / "f.onnx", tmp_path / "dyn.onnx", None, None, dynamic=True)["quantized_layers"]
        >= 2
    )


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_calibration_rows_that_are_not_finite_are_refused_before_quantizing(tmp_path, bad):
    _jax_style_gemm(tmp_path / "f.onnx")
    x = np.random.default_rng(1).normal(size=(8, 16)).astype(np.float32)
    x[3, 5] = bad
    what = "NaN" if np.isnan(bad) else "infinity"
    with pytest.raises(ExportError, match=f"calibration input 'x' holds {what} .*batch 2 of 2"):
        onnx_int8.quantize(tmp_path / "f.onnx", tmp_path / "q.onnx", [{"x": np.zeros_like(x)}, {"x": x}], "MinMax")
    assert not (tmp_path / "q.onnx").exists()

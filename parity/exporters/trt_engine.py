"""TensorRT engine build: the parent ONNX model -> ``model.plan`` for this GPU at one precision.

Every numerics switch is explicit: the precision's builder flag is set and the others are cleared (TensorRT
turns TF32 on by default, so an fp32 build clears it). Tactic timings persist in a timing cache per TensorRT
version and GPU, shared by every build under a file lock. Because autotuning picks kernels by timing, the
engine is built a second time with an empty timing cache, and both engines are run on the golden inputs:
whether they agree bitwise is recorded (``build_determinism``). The first engine is the one saved, checked
and timed.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import numpy as np

from parity.exporters.common import ExportJob
from parity.model import feeds
from parity.platform.cache_dir import cache_root, named_lock
from parity.platform.errors import ExportError, Unavailable, one_line
from parity.platform.safefs import write_bytes_atomic
from parity.runtimes.onnx_common import onnx_feed
from parity.runtimes.trt import cudart, gpu_info, import_tensorrt, logger, run_plan

PLAN_FILE = "model.plan"
WORKSPACE_BYTES = 1 << 30
REDUCED_FLAGS = ("TF32", "FP16", "BF16")  # every builder flag that lowers float32 arithmetic
PRECISION_FLAG = {"fp32": None, "tf32": "TF32", "fp16": "FP16", "bf16": "BF16"}
DETERMINISM_NOTE = "second build autotuned without the timing cache"

log = logging.getLogger(__name__)


def export(job: ExportJob) -> dict:
    """Build ``model.plan`` from the parent ONNX file for ``job.precision`` on CUDA device 0 (the worker's GPU)."""
    trt = import_tensorrt()
    gpu = gpu_info(cudart())
    flags, cleared = precision_flags(trt, job.precision, gpu)
    if job.inputs is None:
        raise ExportError("a TensorRT build is checked on the golden inputs, and none were given")
    parent_dir, parent = job.parent()
    feed = onnx_feed(job.spec, parent, feeds.padded(job.spec, job.inputs, job.batch_size))

    builder = trt.Builder(logger())
    if "FP16" in flags and not getattr(builder, "platform_has_fast_fp16", True):  # the query is gone in 11
        raise Unavailable(f"{gpu['name']} has no fast float16 (TensorRT's platform_has_fast_fp16 is false)")
    network, parser = parse(trt, builder, parent_dir / parent["file"])
    shapes = dynamic_input_shapes(network, {name: value.shape for name, value in feed.items()})

    cache_path = timing_cache_path(trt, gpu)
    with _lock(cache_path):
        stored = cache_path.read_bytes() if cache_path.exists() else b""
    plan, first_s, timing_cache = build(trt, builder, network, flags, cleared, shapes, stored)
    save_timing_cache(builder, timing_cache, cache_path)
    second_plan, second_s, _ = build(trt, builder, network, flags, cleared, shapes, b"")
    del parser  # it owns the network's weights: kept alive until both builds are done

    write_bytes_atomic(Path(job.out_dir) / PLAN_FILE, plan)
    outputs = parent["output_names"]
    determinism = compare(run_plan(plan, feed, outputs), run_plan(second_plan, feed, outputs))
    return {
        "format": "tensorrt",
        "file": PLAN_FILE,
        **{key: parent[key] for key in ("input_names", "output_names", "input_layout", "canonical_layout")},
        "tensorrt": trt.__version__,
        "gpu": gpu,
        "builder": {
            "precision": job.precision,
            "flags": flags,
            "cleared": cleared,
            "workspace_bytes": WORKSPACE_BYTES,
            "timing_cache": str(cache_path),
        },
        "build_determinism": {**determinism, "builds": 2, "note": DETERMINISM_NOTE},
        "build_s": [round(first_s, 3), round(second_s, 3)],
    }


def precision_flags(trt, precision: str, gpu: dict) -> tuple[list[str], list[str]]:
    """(builder flags to set, reduced-precision flags to clear) for ``precision``; Unavailable where it cannot be."""
    capability = gpu["compute_capability"]
    if precision in ("tf32", "bf16") and int(capability.split(".")[0]) < 8:
        raise Unavailable(f"{precision} needs compute capability 8.0 or newer ({gpu['name']} is {capability})")
    wanted = PRECISION_FLAG[precision]
    if wanted is not None and not hasattr(trt.BuilderFlag, wanted):
        raise Unavailable(
            f"TensorRT {trt.__version__} has no {wanted} builder flag (TensorRT 11 builds strongly "
            f"typed networks only): {precision} engines need an ONNX model already in {precision}"
        )
    cleared = [name for name in REDUCED_FLAGS if name != wanted and hasattr(trt.BuilderFlag, name)]
    return ([wanted] if wanted else []), cleared


def parse(trt, builder, onnx_path: Path):
    """The network parsed from ``onnx_path`` and its parser (which must outlive every build of the network)."""
    network = builder.create_network(0)  # explicit batch: the only mode since TensorRT 10
    parser = trt.OnnxParser(network, logger())
    if not parser.parse_from_file(str(onnx_path)):
        messages = [one_line(parser.get_error(i), 300) for i in range(min(parser.num_errors, 3))]
        raise ExportError("TensorRT ONNX parser: " + ("; ".join(messages) or f"could not parse {onnx_path}"))
    return network, parser


def dynamic_input_shapes(network, fed: dict[str, tuple]) -> dict[str, tuple]:
    """The static shape for each network input with dynamic dimensions (an optimization profile pins it), from
    the shapes of the arrays ``fed`` by input name."""
    shapes = {}
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        dims = tuple(tensor.shape)
        if tensor.name not in fed:
            if any(d < 0 for d in dims):
                raise ExportError(
                    f"ONNX input {tensor.name!r} has dynamic shape {dims} and parity feeds only "
                    f"{', '.join(map(repr, fed))}"
                )
            continue
        shape = tuple(fed[tensor.name])
        if not (len(dims) == len(shape) and all(d < 0 or d == s for d, s in zip(dims, shape))):
            raise ExportError(f"the ONNX model takes {tensor.name!r} with shape {dims}; the batch has shape {shape}")
        if any(d < 0 for d in dims):
            shapes[tensor.name] = shape
    return shapes


def build(trt, builder, network, flags, cleared, shapes, timing_cache: bytes):
    """One build: (serialized engine, seconds, the timing cache after the build)."""
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    for name in flags:
        config.set_flag(getattr(trt.BuilderFlag, name))
    for name in cleared:
        config.clear_flag(getattr(trt.BuilderFlag, name))
    if shapes:
        profile = builder.create_optimization_profile()
        for name, shape in shapes.items():
            profile.set_shape(name, shape, shape, shape)
        config.add_optimization_profile(profile)
    cache = config.create_timing_cache(timing_cache)
    if cache is None or not config.set_timing_cache(cache, False):
        log.warning("TensorRT rejected the stored timing cache; building with an empty one")
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, False)
    start = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - start
    if plan is None:
        raise ExportError("TensorRT could not build the engine (see the worker log)")
    return bytes(plan), seconds, config.get_timing_cache()


def timing_cache_path(trt, gpu: dict) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", gpu["name"].lower()).strip("-") or "gpu"
    sm = gpu["compute_capability"].replace(".", "")
    return cache_root() / "tensorrt" / f"timing-{trt.__version__}-{slug}-sm{sm}.cache"


def save_timing_cache(builder, cache, path: Path) -> None:
    """Merge what this build timed into the stored cache (which another build may have grown meanwhile)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path):
        if path.exists():
            stored = builder.create_builder_config().create_timing_cache(path.read_bytes())
            if stored is None or not cache.combine(stored, False):
                log.warning("the stored TensorRT timing cache %s could not be merged; replacing it", path)
        write_bytes_atomic(path, bytes(cache.serialize()))


def compare(first: list[np.ndarray], second: list[np.ndarray]) -> dict:
    """Whether two engines' outputs are bitwise identical, and their largest finite difference."""
    same = all(a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(first, second))
    largest = 0.0
    for a, b in zip(first, second):
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        largest = max(largest, float(diff[np.isfinite(diff)].max(initial=0.0)))
    return {"deterministic": bool(same), "max_abs_diff": largest}


def _lock(path: Path):
    return named_lock(f"tensorrt-timing-cache:{path}")

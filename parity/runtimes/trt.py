"""TensorRT: a serialized engine (``model.plan``) run through TensorRT's Python API, memory and stream via
cuda-python.

Nothing here imports ``tensorrt`` or the CUDA bindings at module level: a CPU-only machine imports this module
and only a runner or a build needs them. The helpers (``import_tensorrt``, ``cudart``, ``gpu_info``,
``run_plan``) are shared with the engine exporter, ``parity.exporters.trt_engine``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import numpy as np

from parity.platform.errors import ExportError, ParityError, Unavailable
from parity.runtimes.onnx_common import OnnxRunner

INSTALL = "pip install parity[gpu]"


def import_tensorrt():
    try:
        import tensorrt
    except ImportError as error:
        raise Unavailable(
            f"tensorrt is not installed ({error}; install it from NVIDIA's index, or {INSTALL})"
        ) from None
    return tensorrt


@functools.lru_cache(maxsize=1)
def logger():
    """One TensorRT logger per process (TensorRT warns when builders and runtimes get different ones)."""
    trt = import_tensorrt()
    return trt.Logger(trt.Logger.WARNING)


def cudart():
    """cuda-python's CUDA runtime bindings: ``cuda.bindings.runtime`` (12.6 and newer), else ``cuda.cudart``."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime
        except ImportError:
            raise Unavailable(f"cuda-python is not installed (pip install cuda-python, or {INSTALL})") from None
    return runtime


def call(rt, result, what: str):
    """The value of a cuda-python call (they return ``(error, *values)``); raise on an error status."""
    error, *values = result
    if error != rt.cudaError_t.cudaSuccess:
        raise ParityError(f"CUDA {what} failed: {getattr(error, 'name', error)}")
    return values[0] if len(values) == 1 else tuple(values)


def gpu_info(rt) -> dict:
    """Name and compute capability of CUDA device 0 (inside a worker, the chosen GPU)."""
    error, count = rt.cudaGetDeviceCount()
    if error != rt.cudaError_t.cudaSuccess or count < 1:
        raise Unavailable(f"no CUDA device here ({getattr(error, 'name', error)})")
    props = call(rt, rt.cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
    name = props.name.split(b"\0")[0].decode() if isinstance(props.name, bytes) else str(props.name)
    return {"name": name.strip(), "compute_capability": f"{props.major}.{props.minor}"}


def engine_dtype(trt, engine, name: str) -> np.dtype:
    try:
        return np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
    except TypeError:
        raise Unavailable(
            f"engine tensor {name!r} has type {engine.get_tensor_dtype(name)}, which NumPy cannot hold"
        ) from None


class EngineSession:
    """A deserialized engine with one device buffer per I/O tensor and a stream; addresses are set once.

    ``input_shapes`` gives the shape of every input whose engine shape has dynamic dimensions."""

    def __init__(self, plan: bytes, input_shapes: dict[str, tuple]):
        self.rt = cudart()
        self.buffers: dict[str, tuple[int, int]] = {}  # name -> (device pointer, bytes)
        self.stream: Any = None  # TensorRT's and the CUDA runtime's objects
        self.context: Any = None
        self.engine: Any = None
        try:
            self._open(import_tensorrt(), plan, input_shapes)
        except BaseException:
            self.close()
            raise

    def _open(self, trt, plan: bytes, input_shapes: dict[str, tuple]) -> None:
        self.engine = trt.Runtime(logger()).deserialize_cuda_engine(plan)
        if self.engine is None:
            raise ExportError(
                "TensorRT could not deserialize the engine (built by another TensorRT version or "
                "for another GPU?); rebuild it"
            )
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise ParityError("TensorRT could not create an execution context (out of device memory?)")
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        for name in self.inputs:
            dynamic = any(d < 0 for d in self.engine.get_tensor_shape(name))
            if dynamic and not (name in input_shapes and self.context.set_input_shape(name, tuple(input_shapes[name]))):
                raise ExportError(f"engine input {name!r} is dynamic and no valid shape was given for it")
        self.stream = call(self.rt, self.rt.cudaStreamCreate(), "cudaStreamCreate")
        self.dtypes: dict[str, np.dtype] = {name: engine_dtype(trt, self.engine, name) for name in names}
        self.shapes: dict[str, tuple[int, ...]] = {name: tuple(self.context.get_tensor_shape(name)) for name in names}
        for name in names:
            nbytes = int(np.prod(self.shapes[name], dtype=np.int64)) * self.dtypes[name].itemsize
            pointer = call(self.rt, self.rt.cudaMalloc(max(nbytes, 1)), "cudaMalloc")
            self.buffers[name] = (int(pointer), nbytes)
            if not self.context.set_tensor_address(name, int(pointer)):
                raise ParityError(f"TensorRT refused the device address of tensor {name!r}")

    def _copy(self, dst, src, nbytes: int, kind: str):
        kinds = self.rt.cudaMemcpyKind
        direction = kinds.cudaMemcpyHostToDevice if kind == "h2d" else kinds.cudaMemcpyDeviceToHost
        call(self.rt, self.rt.cudaMemcpyAsync(dst, src, nbytes, direction, self.stream), "cudaMemcpyAsync")

    def upload(self, arrays: dict[str, np.ndarray]) -> None:
        """Copy host arrays (cast to each input's engine dtype) to the input buffers; returns when done."""
        for name, array in arrays.items():
            array = np.ascontiguousarray(array, dtype=self.dtypes[name])
            if array.shape != self.shapes[name]:
                raise ParityError(f"engine input {name!r} takes shape {self.shapes[name]}, got {array.shape}")
            self._copy(self.buffers[name][0], array.ctypes.data, array.nbytes, "h2d")
            self.synchronize()  # ``array`` may be a temporary: the copy must be finished before it goes

    def execute(self) -> None:
        if not self.context.execute_async_v3(int(self.stream)):
            raise ParityError("TensorRT execution failed (see the worker log)")

    def synchronize(self) -> None:
        call(self.rt, self.rt.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def execute_and_wait(self) -> None:
        self.execute()
        self.synchronize()

    def download(self, names) -> list[np.ndarray]:
        outputs = []
        for name in names:
            out = np.empty(self.shapes[name], dtype=self.dtypes[name])
            self._copy(out.ctypes.data, self.buffers[name][0], out.nbytes, "d2h")
            outputs.append(out)
        self.synchronize()
        return outputs

    def run(self, arrays: dict[str, np.ndarray], output_names) -> list[np.ndarray]:
        self.upload(arrays)
        self.execute()
        return self.download(output_names)

    def device_bytes(self) -> int:
        """The I/O buffers plus the engine's own activation memory."""
        size = getattr(self.engine, "device_memory_size_v2", None)
        if size is None:
            size = self.engine.device_memory_size  # TensorRT before 10.1
        return sum(nbytes for _, nbytes in self.buffers.values()) + int(size)

    def close(self) -> None:
        self.context = None  # the context goes before the engine and the memory it points at
        self.engine = None
        buffers, self.buffers = self.buffers, {}
        for pointer, _ in buffers.values():
            self.rt.cudaFree(pointer)
        if self.stream is not None:
            self.rt.cudaStreamDestroy(self.stream)
            self.stream = None


def run_plan(plan: bytes, arrays: dict[str, np.ndarray], output_names) -> list[np.ndarray]:
    """Run a serialized engine once on host ``arrays`` (by input name); the outputs as the engine gives them."""
    session = EngineSession(plan, {name: array.shape for name, array in arrays.items()})
    try:
        return session.run(arrays, output_names)
    finally:
        session.close()


def check_engine_target(meta: dict, trt, gpu: dict) -> None:
    """An engine runs only on the TensorRT version and GPU it was built with (the export cache keys on both)."""
    built = meta.get("gpu", {})
    if (
        meta.get("tensorrt") != trt.__version__
        or built.get("name") != gpu["name"]
        or built.get("compute_capability") != gpu["compute_capability"]
    ):
        raise ExportError(
            f"the engine was built with TensorRT {meta.get('tensorrt')} for {built.get('name')} "
            f"(sm {built.get('compute_capability')}); this is TensorRT {trt.__version__} on "
            f"{gpu['name']} (sm {gpu['compute_capability']}): it must be rebuilt"
        )


class TrtRunner(OnnxRunner):
    """``trt``: the engine the ``trt build`` step made, run with TensorRT's own runtime."""

    def __init__(self, spec, artifact_dir, meta, batch_size, threads, device="cpu", precision="fp32"):
        super().__init__(spec, artifact_dir, meta, batch_size, threads, device, precision)
        trt = import_tensorrt()
        check_engine_target(meta, trt, gpu_info(cudart()))
        with open(self.model_path, "rb") as f:
            plan = f.read()
        zeros = {
            i.name: np.zeros(spec.input_shape(i.name, batch_size), np.float32 if i.floating else i.dtype)
            for i in spec.model_inputs
        }
        self.session = EngineSession(plan, {name: value.shape for name, value in self.feed(zeros).items()})
        self.numerics = {
            "tensorrt": trt.__version__,
            "precision": precision,
            "builder": meta["builder"],
            "device": device,
        }

    def run_impl(self, x):
        outputs = self.session.run(self.feed(x), self.output_names)
        return tuple(
            np.asarray(out, dtype=np.float32) if np.asarray(out).dtype.kind == "f" else np.asarray(out)
            for out in outputs
        )

    def device_compute(self, x):
        self.session.upload(self.feed(x))
        return self.session.execute_and_wait

    def device_memory_peak_mb(self):
        return self.session.device_bytes() / 2**20

    def close(self) -> None:
        session = self.__dict__.pop("session", None)
        if session is not None:
            session.close()

    def __del__(self):
        with contextlib.suppress(Exception):  # at interpreter shutdown the CUDA bindings may already be gone
            self.close()

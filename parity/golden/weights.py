"""A model's weights as golden work uses them: the golden data's own copy, or the model's own.

The zoo's golden data holds its canonical ``weights.npz`` (its three frameworks share one set of weights). A user
model's keeps no copy: its manifest records the weights' names, shapes and dtypes (``params``) and their digest
(``built_from``, ``parity.model.identity``), every run compares that digest with the model as its builder makes it
now and refuses a model whose weights changed, and each worker task builds the model from its own source (the torch
factory, the Keras file, the JAX params file; an ONNX file's weights are its graph's). Golden data of a user model
built before it stopped keeping one still holds ``weights.npz``: it is read as before.

The orchestrator reads manifests without NumPy: nothing here imports it, or a framework, until a worker reads weights.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

FILE = "weights.npz"


def kept(manifest: dict) -> bool:
    """Whether the golden data holds a copy of the weights (the zoo's; a user model's built before it kept none)."""
    return FILE in (manifest.get("files") or {})


def digest(manifest: dict) -> str | None:
    """What the weights the golden data describes are known by: the copy's sha256, else the digest of the model's
    own weights at its golden build (None for an ONNX file, known by its ``source_sha256``)."""
    if kept(manifest):
        return manifest["files"][FILE]["sha256"]
    return (manifest.get("built_from") or {}).get("weights_sha256")


def described(manifest: dict) -> dict[str, dict]:
    """``{name: {"shape", "dtype"}}`` of every weight: the copy's arrays, else the manifest's ``params``."""
    if kept(manifest):
        return {k: {"shape": v["shape"], "dtype": v["dtype"]} for k, v in manifest["files"][FILE]["arrays"].items()}
    return {
        k: {"shape": v.get("shape") or [], "dtype": v.get("dtype", "float32")}
        for k, v in (manifest.get("params") or {}).items()
    }


def own(spec) -> tuple[Mapping[str, np.ndarray], set[str]]:
    """Worker: the model's own floating-point weights by framework name, each in its own dtype, and the names of the
    trainable ones, as its builder makes it (seeded as a source builds it: a factory with random initial weights
    gives the same ones every time)."""
    framework = spec.frameworks[0]
    if framework == "torch":
        return _torch_weights(spec)
    if framework == "tf":
        return _keras_weights(spec)
    if framework == "jax":
        return _jax_weights(spec)
    return {}, set()  # an ONNX file: its initializers are the graph's


def canonical(spec) -> dict[str, np.ndarray]:
    """Worker: the model's own weights as ``weights.npz`` held them (bfloat16 widened to float32, exactly)."""
    import numpy as np

    arrays, _ = own(spec)
    return {k: v.astype(np.float32) if str(v.dtype) == "bfloat16" else v for k, v in arrays.items()}


def for_build(spec, arrays: Mapping) -> Mapping | None:
    """The weights to hand a source or an exporter of ``spec``: the golden copy where there is one; for a model
    without one, None where its builder holds them itself (torch, Keras: no second copy in memory), else the
    model's own (a JAX function takes them as an argument)."""
    if isinstance(arrays, ModelWeights) and spec.frameworks[0] in ("torch", "tf"):
        return None
    return arrays


class ModelWeights(Mapping):
    """The ``weights.npz`` entry of golden data that keeps no copy: the model's own weights (``canonical``), read
    from its source on first use, in the worker that uses them."""

    def __init__(self, spec, folder):
        self.spec, self.folder = spec, folder
        self._arrays: dict | None = None

    def _read(self) -> dict:
        if self._arrays is None:
            if self.spec is None:
                from parity.platform.errors import GoldenError

                raise GoldenError(f"{self.folder}: the golden data keeps no weights; they are read from the model")
            self._arrays = canonical(self.spec)
        return self._arrays

    def __getitem__(self, name: str) -> Any:
        return self._read()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


class ModuleWeights(Mapping):
    """A torch module's floating weights by ``state_dict`` name, as ``canonical`` names them, each read when asked for
    (no copy of the module's other weights); one a model maps from its weight files in the file's dtype is read in
    the architecture's (``parity.model.weight_files.built_dtypes``)."""

    def __init__(self, module):
        from parity.model.identity import SKIPPED_TORCH_STATE
        from parity.model.weight_files import built_dtypes

        self._state = {
            k: v
            for k, v in module.state_dict().items()
            if not k.endswith(SKIPPED_TORCH_STATE) and v.is_floating_point()
        }
        self._cast = built_dtypes(module) or {}

    def __getitem__(self, name: str) -> Any:
        from parity.model.identity import torch_array
        from parity.model.weight_files import as_built

        return torch_array(as_built(self._state[name], self._cast.get(name)))

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)


class KerasWeights(Mapping):
    """A Keras model's floating weights by variable path, as ``canonical`` names them, each read when asked for (a
    reference built in float64 holds the float32 weights exactly)."""

    def __init__(self, model):
        self._variables = {v.path: v for v in _keras_floating(model)}

    def __getitem__(self, name: str) -> Any:
        import numpy as np

        return np.asarray(self._variables[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._variables)

    def __len__(self) -> int:
        return len(self._variables)


def _torch_weights(spec):
    import torch

    torch.manual_seed(spec.training.seed)
    from parity.model.weight_files import build_mapped

    module = build_mapped(spec)  # each weight read in the model's dtype as it is asked for
    trainable = {name for name, p in module.named_parameters() if p.requires_grad}
    return ModuleWeights(module), trainable


def _keras_weights(spec):
    import keras
    import numpy as np

    from parity.model.user import UserModelError

    keras.utils.set_random_seed(spec.training.seed)
    model = spec.keras_model("float32")
    variables = _keras_floating(model)
    names = [v.path for v in variables]
    if len(set(names)) != len(names):
        raise UserModelError("the Keras model has weights with the same path; give its layers unique names")
    return {v.path: np.asarray(v) for v in variables}, {v.path for v in variables if v.trainable}


def _keras_floating(model) -> list:
    """A Keras model's floating-point variables (float and bfloat16), in the model's order."""
    return [v for v in model.weights if str(v.dtype).startswith(("float", "bfloat"))]


def _jax_weights(spec):
    from parity.model.user import UserModelError
    from parity.platform.safefs import read_npz

    params = read_npz(spec.jax_apply.params_path, UserModelError, ".npz")
    floating = {k: v for k, v in params.items() if v.dtype.kind == "f"}
    return floating, set(floating)


class Fetched(Mapping):
    """The ``weights.npz`` entry of golden data that keeps no copy, where the orchestrator reads it (NumPy only, no
    framework): the weights' names from the manifest, their values from a worker (``fetch(names)`` -> arrays, the
    ``named`` task) when first used, only those asked for (``subset``)."""

    def __init__(self, manifest: dict, fetch):
        self.names, self.fetch = list(described(manifest)), fetch
        self._arrays: dict = {}

    def subset(self, names) -> dict:
        missing = [name for name in names if name not in self._arrays]
        if missing:
            self._arrays.update(self.fetch(missing))
        return {name: self._arrays[name] for name in names}

    def __getitem__(self, name: str) -> Any:
        if name not in self.names:
            raise KeyError(name)
        return self.subset([name])[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def under(weights: Mapping, prefix: str) -> dict:
    """The weights named ``prefix/...`` or ``prefix....`` (a layer's), values read (fetched) for those alone."""
    names = [name for name in weights if name.startswith((f"{prefix}/", f"{prefix}."))]
    return weights.subset(names) if isinstance(weights, Fetched) else {name: weights[name] for name in names}


def named(workspace: str, model: str, names: list[str]) -> dict:
    """Worker task: the model's own weights named ``names`` (``canonical``), for the orchestrator's ``Fetched``."""
    from parity.model.workspace import Workspace

    arrays = canonical(Workspace(workspace).load_spec(model))
    return {name: arrays[name] for name in names}

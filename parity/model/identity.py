"""What a user's model computes with now: a digest of the weights its builder returns, and the user code it runs.

A factory that opens a checkpoint or a config file gives another model once that file changes, while its golden
data (and every export made from it) still describes the old one. ``model_identity`` runs in a worker of the
model's framework, builds the model as the spec's builder does and digests what it holds: a torch module's
``state_dict`` and every buffer, a Keras model's weights, a JAX model's params file, an ONNX file's initializers
(an ONNX file needs none: golden verification already refuses a changed file by its ``source_sha256``). The code is every source file outside the installed packages that the factory's
module and the model's classes reach through their imports. The golden build records both
(``built_from`` in the manifest); every run computes them again and keys its exports on the weights. Changed code is
said on every result (``changes``); changed weights are refused (``stale``) where the golden data keeps no copy of
them to check against (``parity.golden.weights``), else said too. The zoo's weights are its golden data's own: it records nothing.
"""

from __future__ import annotations

import functools
import hashlib
import os
import site
import sys
import sysconfig
import types
from pathlib import Path

from parity.platform.safefs import sha256_file

PARITY_DIR = Path(__file__).resolve().parents[1]
SKIPPED_TORCH_STATE = ("num_batches_tracked",)  # a torch module's state that is no weight (BatchNorm's step count)


@functools.cache
def _installed_roots() -> tuple[str, ...]:
    """Folders of installed code: the standard library, site-packages (every scheme), scripts."""
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib", "scripts")}
    roots.update(site.getsitepackages())
    roots.add(site.getusersitepackages())
    return tuple(sorted(os.path.realpath(r) + os.sep for r in roots if r))


def user_file(path: str) -> bool:
    """Whether ``path`` is a user's source: not installed, not parity's own."""
    real = _realpath(path)
    return not real.startswith(str(PARITY_DIR) + os.sep) and not real.startswith(_installed_roots())


def _realpath(path: str) -> str:
    """``os.path.realpath(path)``, each folder resolved once per process: a process that has imported torch's
    exporter holds 7,000 modules in a few hundred folders (0.21 s resolving each file's every folder, 0.02 s so)."""
    folder, name = os.path.split(path)
    if not os.path.isabs(folder):
        return os.path.realpath(path)
    real = os.path.join(_real_folder(folder), name)
    return os.path.realpath(real) if os.path.islink(real) else real


@functools.cache
def _real_folder(folder: str) -> str:
    return os.path.realpath(folder)


def code_files(roots, workspace: Path) -> dict[str, str]:
    """sha256 of every user source file the ``roots`` (functions, classes, modules) reach through the modules they
    are defined in and what those modules hold (``import x``, ``from x import Block``), by path relative to the
    workspace where it lies inside it. Only reachable modules count: what other models loaded into the same
    process is not this model's code."""
    seen: dict[str, str] = {}  # module name -> its file
    stack = [root if isinstance(root, types.ModuleType) else sys.modules.get(_module_of(root) or "") for root in roots]
    while stack:
        module = stack.pop()
        path = getattr(module, "__file__", None)
        # "__" names are generated code (TensorFlow's autograph writes a new one per run), not the user's
        if (
            module is None
            or module.__name__ in seen
            or module.__name__.startswith("__")
            or not path
            or not os.path.isfile(path)
            or not user_file(path)
        ):
            continue
        seen[module.__name__] = path
        for value in list(vars(module).values()):
            stack.append(value if isinstance(value, types.ModuleType) else sys.modules.get(_module_of(value) or ""))
    return dict(sorted((_shown(path, workspace), sha256_file(Path(path))) for path in seen.values()))


def _module_of(value) -> str | None:
    try:  # a lazy proxy or an odd object may raise on any attribute
        name = getattr(value, "__module__", None)
    except Exception:  # noqa: BLE001 - such a value names no module
        return None
    return name if isinstance(name, str) else None


def _shown(path: str, workspace: Path) -> str:
    real = Path(os.path.realpath(path))
    try:
        return real.relative_to(Path(workspace).resolve()).as_posix()
    except ValueError:
        return str(real)


def weights_digest(arrays, ordered: bool = False) -> str:
    """sha256 over ``(name, dtype, shape, bytes)`` of every array, by name: the same weights, the same digest
    (``ordered``: ``arrays`` come by name already, each read as it comes)."""
    digest = hashlib.sha256()
    for name, dtype, shape, data in arrays if ordered else sorted(arrays, key=lambda item: item[0]):
        digest.update(f"{name}\0{dtype}\0{list(shape)}\0".encode())
        digest.update(data)
        digest.update(b"\0")
    return digest.hexdigest()


def _torch_arrays(module):
    """Every parameter and buffer (non-persistent ones too, which a forward reads all the same), as bytes, by name
    (for ``weights_digest(..., ordered=True)``). A tensor a model memory-mapped from its weight files holds in the
    file's dtype is read as the model is, in the architecture's (``weight_files.built_dtypes``): one at a time."""
    import numpy as np

    from parity.model.weight_files import as_built, built_dtypes

    state = dict(module.named_buffers(remove_duplicate=False))
    state.update(module.state_dict())
    cast = built_dtypes(module) or {}
    for name in sorted(state):
        tensor = as_built(state[name], cast.get(name))
        dtype = "torch.float32" if tensor.is_quantized else str(tensor.dtype)  # a quantized one dequantized
        array = np.ascontiguousarray(torch_array(tensor))
        yield name, dtype, tuple(tensor.shape), array.reshape(-1).view(np.uint8)


def torch_array(tensor):
    """A torch tensor on the host as NumPy, bit for bit in its own dtype: a dtype NumPy lacks (bfloat16, float8)
    through ``ml_dtypes``, a quantized tensor dequantized."""
    import torch

    tensor = tensor.detach().cpu()
    if tensor.is_quantized:
        tensor = tensor.dequantize()
    name = str(tensor.dtype).removeprefix("torch.")
    if name.startswith(("bfloat", "float8")):
        import ml_dtypes

        bits = {1: torch.uint8, 2: torch.int16}[tensor.element_size()]
        return tensor.contiguous().view(bits).numpy().view(getattr(ml_dtypes, name))
    return tensor.numpy()


def numpy_arrays(named):
    """``(name, dtype, shape, bytes)`` of NumPy arrays, as ``weights_digest`` reads them."""
    import numpy as np

    for name, value in named:
        array = np.ascontiguousarray(value)
        yield name, str(array.dtype), array.shape, array.reshape(-1).view(np.uint8)


def _keras_layers(model):
    found, stack = [], [model]
    while stack:
        layer = stack.pop()
        found.append(layer)
        stack.extend(getattr(layer, "layers", None) or ())
    return found


def _factory(builder):
    """The user's own function behind a parity builder (``torch_factory`` and friends keep its reference)."""
    from parity.model.user import resolve

    reference = getattr(builder, "reference", None)
    return resolve(reference, builder.root) if reference else builder


def model_identity(workspace: str, model: str) -> dict | None:
    """Worker task: ``{"weights_sha256", "code"}`` of the user model as its builder makes it now (None for a
    model whose weights are its golden data's own, and for an ONNX file, whose digest the golden data holds)."""
    from parity.model.workspace import Workspace

    ws = Workspace(workspace)
    spec = ws.load_spec(model, attach_golden=False)
    framework = spec.frameworks[0]
    if not spec.weights_from_model or framework == "onnx":
        return None
    if framework == "torch":
        import torch

        torch.manual_seed(spec.training.seed)  # as a source builds it: random initial weights, the same every time
        from parity.model.weight_files import build_mapped

        built = build_mapped(spec)  # a model mapped from its weight files: read a tensor at a time
        arrays = _torch_arrays(built)
        classes = [type(m) for m in built.modules()]
        builder = spec.torch_module
    elif framework == "tf":
        import keras

        keras.utils.set_random_seed(spec.training.seed)
        built = spec.keras_model("float32")
        arrays = numpy_arrays((f"{k}:{v.path}", v.numpy()) for k, v in enumerate(built.weights))
        classes = [type(layer) for layer in _keras_layers(built)]
        builder = spec.keras_model
    else:
        from parity.model.user import UserModelError
        from parity.platform.safefs import read_npz

        builder = spec.jax_apply
        arrays = numpy_arrays(read_npz(builder.params_path, UserModelError, ".npz").items())
        classes = []
    digest = weights_digest(arrays, ordered=framework == "torch")
    code = code_files([_factory(builder), *classes], ws.root)
    for path in getattr(builder, "config_files", ()):  # what the architecture is built from (``hf_model``)
        code[_shown(str(path), ws.root)] = sha256_file(Path(path))
    return {"weights_sha256": digest, "code": dict(sorted(code.items()))}


def changes(model: str, recorded: dict | None, now: dict | None) -> dict | None:
    """What differs between the model the golden data was built from (``recorded``) and the model now:
    ``{"weights": bool, "code": [files], "message"}``, or None when nothing does (or nothing was recorded)."""
    if not recorded or not now:
        return None
    weights = recorded.get("weights_sha256") != now.get("weights_sha256")
    old, new = recorded.get("code") or {}, now.get("code") or {}
    code = sorted(path for path in {**old, **new} if old.get(path) != new.get(path))
    if not weights and not code:
        return None
    what = " and ".join(part for part, changed in (("weights", weights), ("code", code)) if changed)
    files = f" ({', '.join(code[:3])}{f' and {len(code) - 3} more' if len(code) > 3 else ''})" if code else ""
    return {
        "weights": weights,
        "code": code,
        "message": f"the model's {what} changed since its golden data was built{files}; rebuild with "
        f"`parity golden build --model {model}` if the change is intended",
    }


def stale(model: str, changed: dict) -> str:
    """The one line refusing a model whose weights changed since its golden build, where the golden data keeps no
    copy of them to check against (``changed``: ``changes``'s record)."""
    also = f" (and its code: {', '.join(changed['code'][:3])})" if changed.get("code") else ""
    return (
        f"the model's weights changed since its golden data was built{also}, and the golden data keeps no copy of "
        f"the old ones to check against; rebuild it with `parity golden build --model {model}`"
    )


def not_compared(reason: str) -> dict:
    """``changes``'s record for a model that could not be built to compare it (``reason``: why)."""
    return {
        "weights": None,
        "code": [],
        "message": f"the model could not be built to compare it with the one its golden data was built from ({reason})",
    }

"""A user's own model as a parity spec: the builder from a factory or a file, the weights from the model.

``parity init`` writes ``models/<name>.py`` with these helpers; a user may also write one by hand::

    from parity.model.spec import InputSpec, ModelSpec
    from parity.model.user import InputData, torch_factory

    SPEC = ModelSpec(
        name="resnet", description="my ResNet", input=InputSpec("x", (3, 224, 224), layout="native"),
        outputs=("output",), taps=("conv1", "layer1", "fc"), batch_size=1, weights_from_model=True,
        inputs=InputData(distribution="normal", seed=0), loss=None,
        torch_module=torch_factory("mypkg.models:make_model", root=WORKSPACE),
    )

A factory reference is ``package.module:function`` (imported with the workspace on ``sys.path``) or
``path/to/file.py:function`` (relative to the workspace). Nothing here imports an ML framework at
module level: the builders import theirs when a worker calls them.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from parity.model.keras_dtype import rebuilt_in_dtype
from parity.platform.errors import ParityError, one_line
from parity.platform.precision import DTYPE_EPS, DTYPE_MIN_NORMAL

DISTRIBUTIONS = ("normal", "uniform", "integers")
FLOAT32_TOLERANCE_FACTOR = 10.0  # tolerances of a float32 reference
GOLDEN_DATA_CEILING = 8 << 30  # bytes of declared-shape arrays parity allocates at most (less where memory is short)


class UserModelError(ParityError):
    """A user's model that cannot be imported, built or run as declared."""


@dataclass(frozen=True)
class InputData:
    """Where a user model's golden inputs come from, in order of precedence.

    ``file``: a ``.npz`` with the input (under the input's name or ``x``), optional ``labels``, and an
    optional eval set (``eval_x``, ``eval_labels``; default: the inputs themselves).
    ``test_data``: an ONNX test-data folder (``test_data_set_N/input_i.pb``, ``output_i.pb``): inputs
    and golden outputs. ``polygraphy_inputs`` / ``polygraphy_outputs``: Polygraphy JSON files
    (``polygraphy run --save-inputs/--save-outputs``). Otherwise seeded random inputs: ``normal``
    (``mean``, ``std``), ``uniform`` or ``integers`` (``low`` to ``high``, high excluded for integers).
    Relative paths are relative to the workspace.
    """

    file: str | None = None
    test_data: str | None = None
    polygraphy_inputs: str | None = None
    polygraphy_outputs: str | None = None
    distribution: str = "normal"
    mean: float = 0.0
    std: float = 1.0
    low: float = 0.0
    high: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"input distribution {self.distribution!r} is not one of {DISTRIBUTIONS}")
        if self.distribution == "integers" and int(self.high) - int(self.low) < 2:
            raise ValueError(
                f"integer inputs from {self.low:g} to {self.high:g} (excluded) take one value: declare the "
                'range the ids cover, e.g. InputData(distribution="integers", low=0, high=VOCAB_SIZE)'
            )
        if self.polygraphy_outputs and not self.polygraphy_inputs:
            raise ValueError("polygraphy_outputs needs the polygraphy_inputs they were computed from")

    def values(self):
        """The ``Values`` domain of generated inputs that declare none of their own."""
        from parity.model.spec import Values

        if self.distribution == "integers":
            return Values("integers", low=self.low, high=self.high)
        if self.distribution == "uniform":
            return Values("uniform", low=self.low, high=self.high)
        return Values("normal", mean=self.mean, std=self.std)

    def describe(self) -> str:
        if self.file:
            return f"inputs from {self.file}"
        if self.test_data:
            return f"ONNX test data in {self.test_data}"
        if self.polygraphy_inputs:
            return f"Polygraphy inputs {self.polygraphy_inputs}"
        return f"random {self.values().describe()}, seed {self.seed}"


def resolve(reference: str, root: str | Path):
    """The object a ``module:attribute`` or ``file.py:attribute`` reference names (imported now)."""
    module_part, sep, attribute = reference.rpartition(":")
    if not sep or not module_part or not attribute:
        raise UserModelError(
            f"{reference!r} is not a reference like package.module:function or path/to/file.py:function"
        )
    root = Path(root)
    try:
        if module_part.endswith(".py"):
            path = root / module_part  # an absolute path stays as it is
            if not path.is_file():
                raise UserModelError(f"{reference}: no file {path}")
            name = f"parity_user_{abs(hash(str(path.resolve())))}_{path.stem}"
            module = sys.modules.get(name)
            if str(path.parent) not in sys.path:  # its sibling modules import, as when the file runs as a script
                sys.path.insert(0, str(path.parent))
            if module is None:
                module_spec = importlib.util.spec_from_file_location(name, path)
                if module_spec is None or module_spec.loader is None:  # a .py file always has both
                    raise UserModelError(f"{reference}: {path} cannot be imported")
                module = importlib.util.module_from_spec(module_spec)
                sys.modules[name] = module
                module_spec.loader.exec_module(module)
        else:
            if str(root) not in sys.path:
                sys.path.insert(0, str(root))
            module = importlib.import_module(module_part)
    except UserModelError:
        raise
    except (Exception, SystemExit) as error:  # noqa: BLE001 - whatever the user's module raises is its error
        raise UserModelError(
            f"cannot import {module_part}: {one_line(f'{type(error).__name__}: {error}', 300)}"
        ) from None
    target = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise UserModelError(f"{module_part} has no {attribute!r}")
        target = getattr(target, part)
    return target


def _reference_files(reference: str, root: str | Path) -> tuple[Path, ...]:
    """The file a ``file.py:function`` reference names (a module reference is found once imported)."""
    module_part = reference.rpartition(":")[0]
    return (Path(root) / module_part,) if module_part.endswith(".py") else ()


def _call_factory(reference: str, factory, *args):
    try:
        return factory(*args)
    except (Exception, SystemExit) as error:  # noqa: BLE001 - whatever the user's factory raises is its error
        raise UserModelError(f"{reference} raised {one_line(f'{type(error).__name__}: {error}', 300)}") from None


def torch_factory(reference: str, root: str | Path, weights: str | None = None):
    """A ``torch_module`` builder: calls the user's factory, which returns the ``nn.Module`` (trained or loaded).
    With ``weights`` (safetensors files: a file or a folder, relative to the workspace) the factory builds the
    architecture only, its parameters on the meta device, and the files' tensors are memory-mapped into it
    (``parity.model.weight_files``; ``keep_dtypes``: tensors stay in the files' dtypes, for the streamed reference)."""
    weight_path = Path(root) / weights if weights else None
    builder = _torch_builder(lambda: _call_factory(reference, resolve(reference, root)), reference, weight_path)
    # the user's factory, for parity.model.identity; the weight files, for the reference and the memory estimates
    return _identified(
        builder,
        source_files=_reference_files(reference, root),
        reference=reference,
        root=root,
        weight_files=weight_path,
    )


def hf_model(folder: str, root: str | Path):
    """A ``torch_module`` builder of a transformers ``save_pretrained`` folder (relative to the workspace): the
    architecture its ``config.json`` names (``architectures``; its key/value cache off: the model's outputs are
    tensors), its weights memory-mapped from the folder's safetensors as ``torch_factory(..., weights=)`` maps them.
    Nothing is downloaded. The config is part of the model's identity, as a factory's code is."""
    path = Path(root) / folder
    config_file = path / "config.json"

    def make():
        import transformers

        try:
            config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
        except Exception as error:  # noqa: BLE001 - a folder transformers cannot read is the folder's problem
            said = one_line(f"{type(error).__name__}: {error}", 200)
            raise UserModelError(f"{path}: no transformers config ({said})") from None
        name = next(iter(getattr(config, "architectures", None) or ()), None)
        architecture = getattr(transformers, name, None) if name else None
        if architecture is None:
            raise UserModelError(
                f"{config_file} names no transformers architecture ({name or 'no architectures'}); give --torch "
                "FILE.py:FUNCTION building it, with --weights"
            )
        config.use_cache = False
        return architecture(config).eval()

    builder = _torch_builder(make, str(path), path)
    return _identified(builder, source_files=(config_file,), config_files=(config_file,), root=root, weight_files=path)


def _torch_builder(make: Callable[[], Any], what: str, weight_path: Path | None):
    """A ``torch_module(keep_dtypes=False)`` builder of the module ``make()`` returns, its weights mapped from
    ``weight_path``'s safetensors files where given."""

    def torch_module(keep_dtypes: bool = False):
        import torch

        def built():
            model = make()
            if not isinstance(model, torch.nn.Module):
                raise UserModelError(f"{what} returned {type(model).__name__}, not a torch.nn.Module")
            return model

        if weight_path is None:
            return built()
        from parity.model import weight_files

        try:
            return weight_files.build(torch, built, weight_path, keep_dtypes)
        except weight_files.WeightFilesError as error:
            raise UserModelError(str(error)) from None

    return torch_module


def keras_file(path: str, root: str | Path):
    """A ``keras_model`` builder: loads a ``.keras`` file (in float64 by rewriting every layer's dtype policy)."""

    def keras_model(dtype: str):
        import keras

        file = Path(root) / path
        try:
            model = keras.models.load_model(file, compile=False)
        except Exception as error:  # noqa: BLE001 - any loader failure is the file's problem
            raise UserModelError(
                f"cannot load Keras model {file}: {one_line(f'{type(error).__name__}: {error}', 300)}"
            ) from None
        return model if dtype == "float32" else rebuilt_in_dtype(keras, model, dtype)

    return _identified(keras_model, source_files=(Path(root) / path,))


def keras_factory(reference: str, root: str | Path):
    """A ``keras_model`` builder from a function returning the Keras model (``parity.testing.assert_parity``)."""

    def keras_model(dtype: str):
        import keras

        model = _call_factory(reference, resolve(reference, root))
        if not isinstance(model, keras.Model):
            raise UserModelError(f"{reference} returned {type(model).__name__}, not a keras.Model")
        return model if dtype == "float32" else rebuilt_in_dtype(keras, model, dtype)

    return _identified(keras_model, source_files=_reference_files(reference, root), reference=reference, root=root)


def jax_function(reference: str, params_file: str, root: str | Path):
    """A ``jax_apply`` builder around the user's ``apply(params, x)`` (or ``apply(params, x, tap=...)``)
    with the weights in ``params_file`` (a ``.npz``).

    parity keeps parameters flat (``name -> array``, the keys of the ``.npz``); a key with ``/`` is
    handed to the function nested (``{"dense": {"kernel": ...}}``), as Flax stores them.
    """
    function = None

    def jax_apply(params, x, tap=None):
        nonlocal function
        if function is None:
            function = resolve(reference, root)
        nested = unflatten({name: params[name] for name in params})
        args = x if isinstance(x, tuple) else (x,)  # several inputs: positionally, in the spec's order
        if tap is not None and "tap" in inspect.signature(function).parameters:
            return function(nested, *args, tap=tap)
        return function(nested, *args)

    params_path = Path(root) / params_file
    return _identified(
        jax_apply,
        params_path=params_path,
        reference=reference,
        root=root,
        source_files=(*_reference_files(reference, root), params_path),
    )


def _identified(builder: Callable[..., Any], **identity: object) -> Callable[..., Any]:
    """``builder`` carrying its identity as attributes (``source_files``; ``reference`` and ``root`` of a user's
    factory; ``params_path``): what ``parity.model.identity`` reads."""
    for key, value in identity.items():
        setattr(builder, key, value)
    return builder


def unflatten(flat: dict) -> dict:
    """``{"a/b": v}`` -> ``{"a": {"b": v}}``; keys without ``/`` stay as they are."""
    nested: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split("/")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def attach_golden(spec, golden_dir: Path) -> None:
    """Complete a user model's spec from its golden manifest: the parameter table (framework names,
    trainable or not) and, where the reference had to be float32, the widened tolerances it records.

    A missing or broken manifest leaves the spec as it is: verifying the golden data reports that. A tolerance
    factor that does not follow from how the reference was made is refused here (``GoldenError``).
    """
    from parity.model import manifest as manifest_lib
    from parity.platform.errors import GoldenError

    path = Path(golden_dir) / "manifest.json"
    if not path.is_file():
        return
    try:
        manifest = manifest_lib.read(path)
    except GoldenError:
        return
    # a copy of the weights where the golden data keeps one (the zoo's), else their description (``params``)
    kept = manifest["files"].get("weights.npz")
    described = kept["arrays"] if kept else manifest.get("params", {})
    shapes = {name: entry.get("shape") or [] for name, entry in described.items()}
    spec.params = native_params(shapes, manifest.get("params", {}))
    resolve_floor(spec, recorded_floor(manifest, path, spec))
    widen_tolerances(spec, checked_tolerance_factor(manifest, path))
    widen_for_given(spec, (manifest.get("reference") or {}).get("given_vs_reference_max_abs"))


# A float32 error over this many float32 epsilons of the output's largest magnitude is more than rounding explains
# (a sum of n terms rounds to about sqrt(n) of them): the float32 model departs on its own, a fault the check must
# catch, so no tolerance is derived from it.
PLAUSIBLE_FLOOR_UNITS = 256


def float32_floor(max_abs: float, scale: float) -> float:
    """The float32 noise floor of one output: the float32 model's largest error against the float64 reference,
    at least one float32 epsilon of the output's largest magnitude ``scale`` (an exact float32 result still
    rounds), and at least float32's smallest normal number (an all-zero output)."""
    return max(max_abs, DTYPE_EPS["float32"] * scale, DTYPE_MIN_NORMAL["float32"])


def relative_floor(max_abs: float, scale: float) -> float:
    """The floor of one output relative to its scale: float32's cost in units of the tensor's own size, which
    carries to the model's inner tensors whatever their scale (one epsilon for an all-zero output)."""
    return float32_floor(max_abs, scale) / scale if scale > 0 else DTYPE_EPS["float32"]


def implausible_floors(floors: dict | None) -> dict[str, float]:
    """``{output: float32 epsilons of its scale}`` of the measured floors over ``PLAUSIBLE_FLOOR_UNITS``: float32
    arithmetic alone does not explain them, so tolerances are not derived from them."""
    eps = DTYPE_EPS["float32"]
    units = {
        name: f["max_abs"] / max(eps * f["scale"], DTYPE_MIN_NORMAL["float32"]) for name, f in (floors or {}).items()
    }
    return {name: u for name, u in units.items() if u > PLAUSIBLE_FLOOR_UNITS}


def recorded_floor(manifest: dict, path: Path, spec) -> dict | None:
    """The float32 floor the golden build measured (``{output: {"max_abs", "scale"}}``), None where it measured
    none (a float32 reference, a float32 run that failed); a ``GoldenError`` where the spec derives tolerances from
    a floor that golden data built before floors were measured lacks."""
    from parity.model.manifest import rebuild_hint
    from parity.platform.errors import GoldenError

    reference = manifest.get("reference") or {}
    if "float32_floor" not in reference and any(t.floor for t in spec.tolerances.values()):
        raise GoldenError(
            f"{path}: the spec derives its tolerances from the float32 noise floor (floor=), which this golden "
            f"data does not record; {rebuild_hint(Path(path).parent.name)}"
        )
    return reference.get("float32_floor")


def resolve_floor(spec, floors: dict | None) -> None:
    """Replace tolerances declared as ``floor`` times the float32 noise floor (``Tolerances.floor``) by numbers:
    each output with a measured floor ``f`` (``float32_floor``) at atol ``floor·f`` and rtol ``floor`` float32
    epsilons, unless the spec overrides it by name (a declared tolerance wins); outputs without one at the declared
    default. The default, which every tap of a diagnosis is compared at, becomes ``floor`` times the largest
    floor relative to its output's scale, of each tensor's own scale (``Tolerance.scaled``): float32 arithmetic
    costs each tensor about the same fraction of its size wherever it sits in the model. A floor more than
    rounding explains (``implausible_floors``) derives nothing: that output is checked at the declared numbers;
    where every floor is such, the model is."""
    from parity.model.spec import Tolerance, Tolerances

    eps = DTYPE_EPS["float32"]
    implausible = implausible_floors(floors)  # those outputs keep the declared numbers: no floor hides a fault
    measured = {
        name: (float32_floor(f["max_abs"], f["scale"]), relative_floor(f["max_abs"], f["scale"]))
        for name, f in (floors or {}).items()
        if name in spec.outputs and name not in implausible
    }

    def resolve(t: Tolerances) -> Tolerances:
        if not t.floor or not measured:
            return replace(t, floor=0.0)
        factor = t.floor
        overrides = {name: t.default for name in spec.outputs if name not in measured}
        overrides.update({name: Tolerance(factor * f, factor * eps) for name, (f, _relative) in measured.items()})
        overrides.update(t.overrides)
        relative = max(r for _f, r in measured.values())
        return Tolerances(Tolerance(DTYPE_MIN_NORMAL["float32"], factor * eps, factor * relative), overrides)

    spec.tolerances = {p: resolve(t) for p, t in spec.tolerances.items()}


def tolerance_factor(reference_dtype: str) -> float:
    """The factor a user model's tolerances are widened by, from how its golden data was made: 1 for a float64
    reference, ``FLOAT32_TOLERANCE_FACTOR`` for a float32 one. Golden outputs given with the inputs are not
    widened by a factor: their own measured distance from the float64 reference is added to the output atol
    (``widen_for_given``), so a path that departs from them by more than float32 arithmetic explains fails."""
    return 1.0 if reference_dtype == "float64" else FLOAT32_TOLERANCE_FACTOR


def widen_for_given(spec, distance: float | None) -> None:
    """Add the given outputs' measured distance from the reference to every output atol (not the gradients'), up
    to that atol: float32 rounding of the given outputs is allowed for, a departure beyond what float32 explains is
    not (a path agreeing with the reference then fails against them, as it should)."""
    from parity.model.spec import Tolerance

    if not distance:
        return

    def add(t: Tolerance) -> Tolerance:
        return replace(t, atol=t.atol + min(distance, t.atol))

    spec.tolerances = {
        p: replace(t, default=add(t.default), overrides={k: add(v) for k, v in t.overrides.items()})
        for p, t in spec.tolerances.items()
    }


def checked_tolerance_factor(manifest: dict, path: Path) -> float:
    """The manifest's ``reference.tolerance_factor`` if it is what ``tolerance_factor`` derives from the manifest's
    own record of the reference; otherwise a ``GoldenError`` (a number parity never wrote is never trusted)."""
    from parity.model.manifest import rebuild_hint
    from parity.platform.errors import GoldenError

    reference = manifest.get("reference")
    if reference is None:
        return 1.0
    given = (
        reference.get("given_vs_reference_max_abs") is not None
        or reference["outputs_from"] != f"{manifest['reference_framework']} reference"
    )
    derived = tolerance_factor(reference["dtype"])
    if reference["tolerance_factor"] != derived:
        made = f"{reference['dtype']} reference, outputs {'given' if given else 'computed'}"
        raise GoldenError(
            f"{path}: reference.tolerance_factor is {reference['tolerance_factor']:g}, but how the "
            f"reference was made ({made}) gives {derived:g}; {rebuild_hint(Path(path).parent.name)}"
        )
    return derived


def native_params(shapes: dict, params: dict) -> dict:
    """The parameter table of a user model: framework names, shapes as read, no layout conversion
    (``tensor``), trainable and dtype as ``params`` (``{name: {"trainable": bool, "dtype": str}}``, as the
    manifest records) says."""
    from parity.model.spec import ParamSpec

    return {
        name: ParamSpec(
            tuple(shape),
            "tensor",
            params.get(name, {}).get("trainable", False),
            params.get(name, {}).get("dtype", "float32"),
        )
        for name, shape in shapes.items()
    }


def widen_tolerances(spec, factor: float) -> None:
    """Multiply every tolerance of ``spec`` (outputs and gradients, defaults and overrides) by ``factor``."""
    from parity.model.spec import Tolerances

    def widen(t: Tolerances) -> Tolerances:
        def scale(tol):
            return replace(tol, atol=tol.atol * factor, rtol=tol.rtol * factor, scaled=tol.scaled * factor)

        return replace(t, default=scale(t.default), overrides={k: scale(v) for k, v in t.overrides.items()})

    if factor != 1:
        spec.tolerances = {p: widen(t) for p, t in spec.tolerances.items()}
        spec.grad_tolerances = {p: widen(t) for p, t in spec.grad_tolerances.items()}


def golden_data_limit() -> tuple[int, str]:
    """The most bytes of declared-shape arrays parity allocates, and how that limit was chosen: the smaller of
    ``GOLDEN_DATA_CEILING`` and a quarter of the memory available now (drawing them takes more than they hold)."""
    import psutil

    available = psutil.virtual_memory().available
    why = f"the smaller of {format_bytes(GOLDEN_DATA_CEILING)} and a quarter of the {format_bytes(available)} available"
    return min(GOLDEN_DATA_CEILING, available // 4), why


def check_data_size(what: str, shape, dtype: str, copies: int = 1) -> None:
    """Refuse (``UserModelError``), before anything is allocated, ``copies`` arrays of ``shape`` and ``dtype`` that
    would take more than ``golden_data_limit``, sized as parity holds them: 8 bytes an element at least (values are
    drawn in float64 or int64 before the cast, and the golden reference is computed in float64)."""
    import math

    import numpy as np

    from parity.model.values import stored_dtype

    itemsize = max(np.dtype(stored_dtype(dtype)).itemsize, 8)
    need = copies * math.prod(int(d) for d in shape) * itemsize
    limit, why = golden_data_limit()
    if need > limit:
        raise UserModelError(
            f"{what} of shape {tuple(int(d) for d in shape)} {dtype} would take {format_bytes(need)} "
            f"as parity holds it (drawn and referenced at 8 bytes an element); parity refuses golden "
            f"data over {format_bytes(limit)} ({why}): declare a smaller batch or input shape"
        )


def format_bytes(count: int) -> str:
    """``count`` bytes in binary units, e.g. ``2.3 TiB``."""
    if count < 1024:
        return f"{count} bytes"
    size = float(count)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024:
            return f"{size:.1f} {unit}"
    return f"{size / 1024:.1f} PiB"

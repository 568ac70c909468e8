"""A user's Keras model rebuilt in another floating dtype (float64 for the golden reference), its weights kept under
the full paths the model itself gives them.

The rebuild deserialises the model's own config with every floating dtype rewritten, under a global dtype policy of
that dtype (so a custom layer that makes its sublayers without a dtype makes them in it too). A sublayer's weight
path depends on where it was built, not on the config: a nested ``Sequential`` built when the outer model called it
names its weights ``bottleneck/conv_a/kernel``, the same ``Sequential`` deserialised builds itself on its own and
names them ``conv_a/kernel``. The rebuild's weights therefore stand one for one, in order, for the original's: each
pair is checked (shape, and the same layer and variable name at the end of the path) and the rebuilt one takes the
original's full path, which is the name the golden weights are stored under. Nothing here imports Keras at module
level: the builders hand it in.
"""

from __future__ import annotations

from parity.platform.errors import ParityError

FLOATING = ("float", "bfloat")


def rebuilt_in_dtype(keras, model, dtype: str):
    """``model``'s architecture built with every layer (inputs too) in ``dtype``, its weights copied and cast, and
    each weight under the path it has in ``model``. Raises ``ParityError`` naming the first layer or weight that
    cannot be rebuilt so (a layer that computes in a dtype of its own, a rebuild that does not pair up)."""
    config = keras.saving.serialize_keras_object(model)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(dtype)
    try:
        clone = keras.saving.deserialize_keras_object(_rewrite(config, dtype))
    finally:
        keras.config.set_dtype_policy(previous)
    _check_layers(clone, dtype)
    originals, rebuilt = list(model.weights), list(clone.weights)
    if len(originals) != len(rebuilt):
        raise ParityError(
            f"the Keras model rebuilt in {dtype} has {len(rebuilt)} weights, the model {len(originals)} (a layer "
            f"that does not rebuild from its config)"
        )
    for original, copy in zip(originals, rebuilt):
        _check_pair(original, copy, dtype)
    # a weight the layer keeps in a dtype of its own (a float32 scale of a float64 layer) keeps its exact value
    clone.set_weights([w.astype(c.dtype) for w, c in zip(model.get_weights(), rebuilt)])
    for original, copy in zip(originals, rebuilt):
        copy._path = original.path  # the name its value is stored under; Keras keeps no other record of it
    return clone


def _check_layers(clone, dtype: str) -> None:
    """Every layer of the rebuild, nested ones too, computes in ``dtype``: a layer that sets its own dtype where
    the config does not say so (a sublayer made with ``dtype="float32"``) would make a weaker reference that
    looks like a ``dtype`` one."""
    flatten = getattr(clone, "_flatten_layers", None)
    layers = list(flatten(include_self=False, recursive=True)) if flatten else list(clone.layers)
    for layer in layers:
        computes = str(getattr(layer, "compute_dtype", None) or "")
        if computes.startswith(FLOATING) and computes != dtype:
            raise ParityError(
                f"layer {layer.name!r} ({type(layer).__name__}) computes in {computes} in the model rebuilt in "
                f"{dtype} (it sets its own dtype)"
            )


def _check_pair(original, copy, dtype: str) -> None:
    """The rebuilt weight ``copy`` stands for ``original``: same shape, same layer and variable name."""
    if tuple(original.shape) != tuple(copy.shape) or _tail(original.path) != _tail(copy.path):
        raise ParityError(
            f"the Keras model rebuilt in {dtype} does not pair weight {original.path!r} {tuple(original.shape)} "
            f"with {copy.path!r} {tuple(copy.shape)} (a layer that does not rebuild from its config)"
        )
    if not hasattr(copy, "_path"):
        raise ParityError(f"this Keras keeps weight paths elsewhere; cannot name weight {original.path!r}")


def _tail(path: str) -> tuple[str, ...]:
    """The layer and variable name at the end of a weight's path (``conv_a/kernel`` of ``bottleneck/conv_a/kernel``)."""
    return tuple(path.split("/")[-2:])


def _rewrite(node, dtype: str):
    """A serialised Keras config with every floating dtype (a ``DTypePolicy``'s name, a ``dtype`` string) ``dtype``."""
    if isinstance(node, dict):
        if node.get("class_name") == "DTypePolicy" and isinstance(node.get("config"), dict):
            return {**node, "config": {**node["config"], "name": dtype}}
        return {
            key: (
                dtype
                if key == "dtype" and isinstance(value, str) and value.startswith(FLOATING)
                else _rewrite(value, dtype)
            )
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_rewrite(item, dtype) for item in node]
    return node

"""Worker tasks of a golden build: train the zoo's weights, compute a framework's float64 reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity import sources
from parity.golden.store import load_arrays, save_npz
from parity.model import batch_axes, feeds
from parity.model.workspace import Workspace


def train_weights(workspace: str, model: str, train_file: str, eval_file: str, out_file: str) -> dict:
    """Seeded, deterministic training of the torch definition; canonical float32 weights to ``out_file``."""
    import torch

    from parity.sources.torch import build_module, canonical_state

    spec = Workspace(workspace).load_spec(model)
    cfg = spec.training
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    module = build_module(spec, None, "float32").train()
    with np.load(train_file, allow_pickle=False) as data:
        x = torch.from_numpy(data["x"].astype(np.float32))
        y = torch.from_numpy(data["y"])
    optimizer = torch.optim.Adam(module.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    order = torch.Generator().manual_seed(cfg.seed)
    for _ in range(cfg.epochs):
        for batch in torch.randperm(len(x), generator=order).split(cfg.batch_size):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(module(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
    module.eval()
    weights = canonical_state(spec, module)
    save_npz(Path(out_file), weights)
    with torch.no_grad():
        train_accuracy = float((module(x).argmax(-1) == y).float().mean())
    return {"final_loss": float(loss), "train_accuracy": train_accuracy}


def fp64_reference(workspace: str, model: str, framework: str, scratch: str | Path, out_file: str) -> None:
    """Outputs, taps, eval logits and gradients of one framework's definition in float64."""
    spec = Workspace(workspace).load_spec(model)
    scratch = Path(scratch)
    arrays, _ = reference_arrays(
        spec,
        framework,
        load_arrays(scratch, "weights.npz"),
        load_arrays(scratch, "inputs.npz"),
        load_arrays(scratch, "eval.npz"),
        "float64",
        detect_axes=False,
    )  # the zoo's outputs and taps are batched on axis 0
    save_npz(Path(out_file), arrays)


def reference_arrays(
    spec,
    framework: str,
    weights: dict,
    inputs: dict,
    evals: dict,
    dtype: str,
    detect_axes: bool = True,
    record: dict | None = None,
) -> tuple[dict, dict]:
    """A native source's outputs, taps, eval outputs (``eval/logits``) and, with a loss, gradients (``grad/…``),
    all computed in ``dtype`` from the golden ``inputs.npz`` and ``eval.npz`` arrays, and the batch axis of every
    output and tap (``detect_axes``; else none recorded: axis 0); a definition that returns another floating dtype
    anywhere raises ``TypeError`` (integer and bool outputs are compared as they are). ``record`` receives how a
    torch reference ran (``{"mode", "why"}``: ``parity.sources.torch_streamed``)."""
    source = sources.native(framework)(
        spec, weights, spec.batch_size, dtype
    )  # each source holds every weight as layouts.held_dtype says
    x = feeds.from_arrays(spec, inputs)  # floating feeds are cast to ``dtype`` by the runner; token ids stay integers
    arrays = dict(source.run(x))
    if spec.taps:
        arrays.update({f"tap/{name}": v for name, v in source.taps(x).items()})

    def run_at(other_x: dict, batch: int) -> dict:  # a source that runs any batch size is not built twice
        other = (
            source if getattr(source, "any_batch", False) else sources.native(framework)(spec, weights, batch, dtype)
        )
        return {**other.run(other_x), **({f"tap/{n}": v for n, v in other.taps(other_x).items()} if spec.taps else {})}

    axes = detect_batch_axes(spec, arrays, evals, run_at) if detect_axes else {}
    arrays["eval/logits"] = feeds.run_batched(source, feeds.from_arrays(spec, evals), spec.batch_size, axes)[
        batch_axes.eval_output(spec, axes)
    ]
    if spec.loss is not None:
        arrays.update({f"grad/{name}": v for name, v in source.gradients(x, inputs["labels"]).items()})
    for key, value in arrays.items():
        if value.dtype.kind == "f" and value.dtype != np.dtype(dtype):
            raise TypeError(f"{framework} returned {value.dtype} for {key} in a {dtype} run")
    if record is not None and getattr(source, "reference_record", None) is not None:
        record.update(source.reference_record() or {})
    return arrays, axes


def detect_batch_axes(spec, arrays: dict, evals: dict, run_at) -> dict:
    """Output name / ``tap/<name>`` -> its batch axis or None, from ``arrays`` (computed at the golden batch size)
    and ``run_at(feeds, batch)`` (the same outputs and taps at one sample more, the eval split's first rows): an
    axis is the batch's where it follows the batch size. A model without a batched input has none; one that does
    not run at another batch size keeps axis 0 where its size is the batch's."""
    shapes = {key: tuple(np.shape(value)) for key, value in arrays.items()}
    if not any(i.batched for i in spec.model_inputs):
        return dict.fromkeys(shapes)
    other = spec.batch_size + 1
    x = feeds.padded(spec, feeds.rows(spec, feeds.from_arrays(spec, evals), 0, other), other)
    try:
        found = run_at(x, other)
    except Exception:  # noqa: BLE001 - a model that takes one batch size only (its verification shapes say so)
        return batch_axes.guess(shapes, spec.batch_size)
    return batch_axes.detect(
        shapes, {key: tuple(np.shape(value)) for key, value in found.items()}, spec.batch_size, other
    )

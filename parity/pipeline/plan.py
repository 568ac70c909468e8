"""``parity plan``: each step's estimated peak memory and rough time (``parity.run.estimate``) for a model of the
workspace or of a given size, against the memory available here, and for a step that does not fit, the Ray node
resources it would fit on."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from parity.platform.errors import UsageError
from parity.platform.memory import Available, available, gb

DEFAULT_BATCH, DEFAULT_SEQ = 2, 64
MAX_PARAMS = 1e13  # ten trillion parameters, 40 TB of float32 weights: past any model converted today


@dataclass
class Plan:
    what: str  # the model, in words
    weights: int  # bytes of float32 weights
    here: Available
    rows: list[dict]

    def as_json(self) -> str:
        return json.dumps(
            {
                "model": self.what,
                "weights_bytes": self.weights,
                "available_bytes": self.here.nbytes,
                "available_from": self.here.describe(),
                "steps": self.rows,
            },
            indent=2,
        )

    def render(self) -> str:
        lines = [f"{self.what}: {gb(self.weights)} of float32 weights; here: {self.here.describe()}"]
        lines.append(f"{'stage':13s} {'step':47s} {'peak':>9s} {'time':>8s}  fits here")
        for row in self.rows:
            memory = int((row["ray_resources"] or {}).get("memory") or 0)
            fits = "yes" if row["fits"] else f"no: a Ray node with memory={memory} ({gb(memory)})"
            lines.append(
                f"{row['stage']:13s} {row['label']:47s} {gb(row['peak_bytes']):>9s} {_time(row['seconds']):>8s}  {fits}"
            )
        if not all(row["fits"] for row in self.rows):
            lines.append(
                "a Ray node advertises its memory with `ray start --memory BYTES`; `parity run --executor ray` places "
                "cells there (docs: Run on a Ray cluster)"
            )
        return "\n".join(lines)


def _time(seconds: float) -> str:
    if seconds < 60:
        return f"{max(seconds, 1):.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def plan(
    workspace: str | None,
    model: str | None,
    params: float | None,
    batch: int | None,
    seq: int | None,
    notice,
    mapped: bool = False,
) -> Plan:
    """The plan of ``model`` (its golden data's size, else its weights as its builder makes them) or of a Llama-shaped
    model of ``params`` parameters at ``batch`` x ``seq`` tokens (``mapped``: its weights mapped from its files; a
    model of the workspace is when it declares them)."""
    from parity.run import estimate

    if (model is None) == (params is None):
        raise UsageError("give --model NAME or --params COUNT (e.g. --params 7e9)")
    if mapped and model is not None:
        raise UsageError("--mapped is for --params; a model of the workspace is mapped when its spec declares weights")
    here = available()
    if params is not None:
        if not math.isfinite(params) or not 0 < params <= MAX_PARAMS:
            raise UsageError(
                f"--params {params:g}: give a number of parameters above 0 and at most {MAX_PARAMS:g} (e.g. 7e9)"
            )
        batch, seq = batch or DEFAULT_BATCH, seq or DEFAULT_SEQ
        weights = int(params * 4)
        activations = estimate.llama_activations(params, batch, seq)
        what = f"a Llama-shaped model of {params:.3g} parameters at {batch} x {seq} tokens"
    else:
        if seq is not None:
            raise UsageError("--seq is for --params; a model's inputs are its spec's")
        assert model is not None  # one of the two, as checked above
        weights, activations, what, mapped = _model_size(workspace, model, batch, notice)
    if mapped:
        what = f"{what}, its weights mapped from its files"
    return Plan(what, weights, here, estimate.plan(weights, activations, here, mapped))


def _model_size(workspace: str | None, model: str, batch: int | None, notice) -> tuple[int, int, str, bool]:
    """Bytes of ``model``'s weights and float64 activations: its golden manifest's, else its builder's weights; and
    whether it maps them from its weight files."""
    from parity.golden import store
    from parity.model import weight_files
    from parity.pipeline.jobs import open_workspace
    from parity.run import estimate, watch

    ws = open_workspace(workspace, notice)
    spec = ws.load_spec(model, attach_golden=False)
    mapped = weight_files.declared(spec) is not None
    scale = batch / spec.batch_size if batch else 1.0
    golden_dir = ws.golden_dir(model)
    if (golden_dir / store.MANIFEST).exists():
        manifest = store.verified_manifest(golden_dir)
        weights = watch.weights_bytes(manifest)
        activations = int(estimate.activation_bytes(manifest) * scale)
        return weights, activations, f"{model} (its golden data, batch {batch or spec.batch_size})", mapped
    from parity.platform.cache_dir import cache_root
    from parity.platform.env import default_threads
    from parity.run.pool import WorkerPool

    with WorkerPool(default_threads(), cache_root() / "logs", timeout_s=None) as pool:
        weights = pool.call(spec.frameworks[0], "parity.model.size:weights_bytes", workspace=str(ws.root), model=model)
    if weights is None:
        raise UsageError(f"{model}: its size is not known before its golden build; give --params COUNT instead")
    return weights, 0, f"{model} (no golden data yet: activations not counted)", mapped

"""torch -> ExecuTorch: the ExportedProgram lowered to XNNPACK where the partitioner takes it (portable kernels run
the rest), written as the ``.pte`` program the ExecuTorch runtime loads."""

from __future__ import annotations

from pathlib import Path

from parity.exporters.common import ExportJob
from parity.exporters.torch_export import axis_bounds, bounded_shapes, exported_program
from parity.platform.errors import ExportError, one_line
from parity.platform.safefs import write_bytes_atomic

PTE_FILE = "model.pte"
# ``getitem`` nodes pick a delegate call's results apart: bookkeeping, not a kernel that runs
_BOOKKEEPING = ("getitem",)


def export(job: ExportJob) -> dict:
    """Exported with every named axis dynamic between 1 and its largest size parity runs (ExecuTorch plans memory
    for the upper bound), lowered with ``to_edge_transform_and_lower(partitioner=[XnnpackPartitioner()])``.
    ``meta["delegation"]`` counts the operators XNNPACK took and those left to portable kernels; ``meta["axes"]``
    the axes as exported, with their bounds, or static with the reason where the bounded export raised."""
    spec = job.spec
    bounds = axis_bounds(job)
    program, axes = exported_program(job, bounded_shapes(spec, bounds))
    try:
        buffer, delegation = _lower(program)
    except ExportError as error:
        if not axes["dynamic"]:
            raise
        # lowered static at the traced shape instead, and the record says why the bounded axes were not kept
        program, axes = exported_program(job, None, f"executorch could not lower the dynamic axes: {error}")
        buffer, delegation = _lower(program)
    if axes["dynamic"]:
        axes["bounds"] = {axis: [1, upper] for axis, upper in bounds.items()}
    write_bytes_atomic(Path(job.out_dir) / PTE_FILE, buffer)
    layout = spec.model_inputs[0].layout if spec.model_inputs else "flat"
    return {
        "format": "pte",
        "file": PTE_FILE,
        "input_names": [i.name for i in spec.model_inputs],
        "output_names": list(spec.outputs),
        "input_layout": layout,
        "canonical_layout": layout,
        "axes": axes,
        "delegation": delegation,
    }


def _lower(program) -> tuple[bytes, dict]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    try:
        edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
        delegation = delegation_counts(edge.exported_program().graph_module)
        return bytes(edge.to_executorch().buffer), delegation
    except Exception as error:  # noqa: BLE001 - the lowering's own message is the export error
        raise ExportError(one_line(f"{type(error).__name__}: {error}", 250)) from None


def delegation_counts(graph_module) -> dict:
    """How many operator nodes XNNPACK took (in how many delegated subgraphs) and which were left to ExecuTorch's
    portable kernels, by operator (``executorch.devtools.backend_debug.get_delegation_info``)."""
    from executorch.devtools.backend_debug import get_delegation_info

    info = get_delegation_info(graph_module)
    portable = {
        op: b.non_delegated
        for op, b in info.delegation_by_operator.items()
        if b.non_delegated and op not in _BOOKKEEPING
    }
    delegated = sum(b.delegated for op, b in info.delegation_by_operator.items() if op not in _BOOKKEEPING)
    return {
        "backend": "XnnpackBackend",
        "delegated_subgraphs": info.num_delegated_subgraphs,
        "delegated_nodes": delegated,
        "portable_nodes": sum(portable.values()),
        "portable_ops": portable,
    }

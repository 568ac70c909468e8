"""An ONNX file as the source: the user's file, checked against the golden it was built from, as the artifact."""

from __future__ import annotations

from parity.exporters.common import ExportJob, needed, onnx_meta, save_onnx
from parity.model.containers import graph_feeds
from parity.platform.errors import GoldenError


def export(job: ExportJob) -> dict:
    """The source file as the artifact (its external data folded in, or, past ``external_threshold``: protobuf's 2 GiB,
    in a data file beside it).

    The graph is not rewritten: a static batch other than the file's own is the runtime's to accept
    (a fixed batch dimension makes other batch sizes an error, reported as such).
    """
    from parity.interop import onnx_file as onnx_source
    from parity.interop import onnx_test_data as interop

    spec = job.spec
    source = spec.onnx_model_path  # golden.load (export_step) verified it is the file the golden was built from
    model = onnx_source.load_checked(source)
    if onnx_source.source_digest(source) != needed(job.golden_manifest, "the golden manifest").get("source_sha256"):
        raise GoldenError(f"{source} changed while it was read; try again")
    save_onnx(model, job.out_dir)  # beyond protobuf's 2 GiB: its tensors in a data file beside it
    inputs, outputs = interop.graph_signature(model)
    if outputs != list(spec.outputs):
        raise GoldenError(f"{source} has outputs {outputs}; the spec names {list(spec.outputs)}")
    names = [i.name for i in spec.model_inputs]
    if sorted(inputs) != sorted(graph_feeds(spec, dict.fromkeys(names))):  # a sequence's elements feed one input
        raise GoldenError(f"{source} has inputs {list(inputs)}; the spec names {names}")
    meta = onnx_meta(spec, names, outputs, spec.model_inputs[0].layout if spec.model_inputs else "flat")
    return {**meta, "user_file": True}  # the user's own graph, checked by load_checked: not an export parity wrote

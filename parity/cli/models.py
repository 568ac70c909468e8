"""``init`` and ``export-testdata``: a spec for your own model, and golden data as ONNX test data."""

from __future__ import annotations

import click

from parity.cli.common import EXISTING_FILE, EXISTING_FOLDER, FOLDER, fail, handle_errors, note, workspace_option


@click.command()
@click.argument("name")
@click.option(
    "--torch",
    "torch_ref",
    metavar="MODULE:FUNCTION",
    help="A function returning the torch.nn.Module (package.module:make_model or path/to/file.py:make_model).",
)
@click.option(
    "--keras",
    "keras_ref",
    metavar="FILE",
    help="A Keras model file (.keras), or MODULE:FUNCTION returning the model (a model with custom layers).",
)
@click.option(
    "--weights",
    type=click.Path(exists=True),
    help="With --torch: the model's safetensors file or folder (sharded, with its index). The function builds the "
    "architecture only; the weights are memory-mapped into it, and a model too big to hold in float32 is checked "
    "from the files.",
)
@click.option("--jax", "jax_ref", metavar="MODULE:FUNCTION,PARAMS.npz", help="apply(params, x) and its weights.")
@click.option("--onnx", "onnx_ref", metavar="FILE", help="An ONNX file: the file itself is the source model.")
@click.option(
    "--hf",
    "hf_folder",
    type=EXISTING_FOLDER,
    help="A transformers save_pretrained folder (config and safetensors; nothing is downloaded): its architecture "
    "from config.json, its weights memory-mapped; default input input_ids=2x64. With --task text-generation: checked "
    "as it generates.",
)
@click.option(
    "--task",
    type=click.Choice(["text-generation"]),
    default=None,
    help="text-generation: a causal LM checked as it generates, greedy with a key/value cache, step by step.",
)
@click.option(
    "--input",
    "input_decls",
    metavar="NAME=BATCHxDIMx...[:DTYPE[:VALUES]]",
    multiple=True,
    help="An input, batch first (one --input per input), e.g. x=1x3x224x224, ids=2x16:int64:30522 (ids 0 "
    "to 30521), mask=2x16:int64:mask, or with a named dynamic axis input_ids=2,sequence:int64.",
)
@click.option(
    "--axis",
    "axes",
    metavar="NAME=SIZE",
    multiple=True,
    help="The golden size of a named axis of the inputs, e.g. sequence=16.",
)
@click.option(
    "--inputs",
    "inputs_file",
    type=EXISTING_FILE,
    help=".npz with each input under its name (optional labels, eval_<name>, eval_labels); without "
    "--input, the inputs' names, shapes and dtypes are the file's. Default: seeded random.",
)
@click.option(
    "--test-data",
    type=EXISTING_FOLDER,
    help="ONNX test-data folder (test_data_set_N/input_i.pb, output_i.pb): inputs and golden outputs.",
)
@click.option("--polygraphy-inputs", type=EXISTING_FILE, help="Inputs saved by polygraphy run --save-inputs.")
@click.option("--polygraphy-outputs", type=EXISTING_FILE, help="Golden outputs saved by polygraphy run --save-outputs.")
@click.option(
    "--opset",
    type=click.IntRange(1),
    default=None,
    help="Convert the ONNX file to this opset first (onnx.version_converter; ONNX Runtime needs 7 or more); "
    "the converted file is written to models/NAME.opsetN.onnx and recorded.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random inputs.")
@click.option("--force", is_flag=True, help="Replace an existing models/NAME.py.")
@click.option(
    "--workspace",
    "-w",
    type=FOLDER,
    default=None,
    help="Folder to write models/NAME.py into (default: the current folder).",
)
@handle_errors
def init(
    name,
    torch_ref,
    weights,
    keras_ref,
    jax_ref,
    onnx_ref,
    hf_folder,
    task,
    input_decls,
    axes,
    inputs_file,
    test_data,
    polygraphy_inputs,
    polygraphy_outputs,
    opset,
    seed,
    force,
    workspace,
):
    """Write models/NAME.py for your own model: a short spec to edit, then golden build and run.

    \b
    Example:
        parity init resnet --torch mymodels.py:make_model --input x=1x3x224x224
        parity golden build --model resnet
        parity run --model resnet
        parity init bert --torch mymodels.py:make_bert --input input_ids=2,sequence:int64 \\
            --input attention_mask=2,sequence:int64:mask --axis sequence=16
        parity init llama --torch mymodels.py:make_llama --weights ./tiny-llama \
            --input input_ids=2x64:int64:32000
        parity init llama --hf ./tiny-llama
        parity init llama --hf ./tiny-llama --task text-generation
    """
    from parity.pipeline import model_jobs

    if task:
        if keras_ref or jax_ref or onnx_ref or input_decls or test_data or polygraphy_inputs or weights:
            fail("--task text-generation takes --hf FOLDER or --torch MODULE:FUNCTION, and prompts with --inputs")
        written = model_jobs.init_generation(name, hf_folder, torch_ref, force, workspace, inputs_file)
        click.echo(f"wrote {written} (text-generation, {'folder ' + hf_folder if hf_folder else torch_ref})")
        click.echo(f"next: parity golden build --model {name} && parity check --model {name}")
        return
    written, info, kind = model_jobs.init_model(
        name,
        {"torch": torch_ref, "tf": keras_ref, "jax": jax_ref, "onnx": onnx_ref, "hf": hf_folder},
        input_decls,
        axes,
        {
            "inputs_file": inputs_file,
            "test_data": test_data,
            "polygraphy_inputs": polygraphy_inputs,
            "polygraphy_outputs": polygraphy_outputs,
        },
        seed,
        force,
        workspace,
        opset,
        weights,
    )
    taps = len(info.get("taps") or [])
    click.echo(
        f"wrote {written} ({kind}, {info['n_params']:,} parameters, outputs {', '.join(info['outputs'])}, {taps} taps)"
    )
    click.echo(f"next: parity golden build --model {name} && parity run --model {name}")


@click.command("export-testdata")
@click.option("--model", "-m", "model", required=True, help="Model name.")
@click.option(
    "--out",
    "out_dir",
    type=FOLDER,
    required=True,
    help="Folder to write test_data_set_0/ into (next to a model.onnx, say).",
)
@workspace_option
@handle_errors
def export_testdata(model, out_dir, workspace):
    """Write a model's golden inputs and outputs as ONNX test data (test_data_set_0/input_0.pb, output_i.pb).

    The layout ONNX's backend tests and ONNX Runtime's onnx_test_runner read. Inputs are in the spec's
    canonical layout (NCHW images), outputs float32 as an exported model gives them.

    \b
    Example:
        parity export-testdata --model cnn --out cnn-testdata/
    """
    from parity.pipeline import model_jobs

    written, spec = model_jobs.export_test_data(workspace, model, out_dir, notice=note)
    inputs = ", ".join(i.name for i in spec.model_inputs)
    click.echo(f"wrote {written} (inputs {inputs}, outputs {', '.join(spec.outputs)}; batch {spec.batch_size})")

"""A factory that does not give the same weights twice (unseeded NumPy randomness) fails its golden build in one
line, instead of building golden data that every later run refuses as built from other weights."""

from __future__ import annotations

import json
import textwrap

from click.testing import CliRunner

from parity.cli import cli

MODEL = """
    import numpy as np
    import torch

    def make(seeded=False):
        rng = np.random.default_rng(0 if seeded else None)
        net = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh())
        arrays = {"0.weight": rng.normal(size=(4, 6)), "0.bias": rng.normal(size=4)}
        net.load_state_dict({name: torch.from_numpy(value.astype(np.float32)) for name, value in arrays.items()})
        return net

    def make_seeded():
        return make(seeded=True)
"""


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_a_factory_of_unseeded_random_weights_fails_its_golden_build_in_one_line(tmp_path):
    (tmp_path / "mymodel.py").write_text(textwrap.dedent(MODEL))
    for name, factory in (("net", "make"), ("seeded", "make_seeded")):
        made = invoke(
            "init", name, "--workspace", tmp_path, "--torch", f"{tmp_path / 'mymodel.py'}:{factory}", "--input", "x=2x6"
        )
        assert made.exit_code == 0, made.output
    built = invoke("golden", "build", "--workspace", tmp_path, "--model", "net")
    assert built.exit_code == 2, built.output
    assert "the factory does not give the same weights twice: seed it or load a checkpoint" in built.output
    assert "Traceback" not in built.output
    assert not (tmp_path / "golden" / "net" / "manifest.json").exists()
    seeded = invoke("golden", "build", "--workspace", tmp_path, "--model", "seeded")  # the same factory, seeded
    assert seeded.exit_code == 0, seeded.output
    manifest = json.loads((tmp_path / "golden" / "seeded" / "manifest.json").read_text())
    assert manifest["built_from"]["weights_sha256"]

"""scripts/probe_layers.py on real exporters and runtimes: a float64 island that OpenVINO's converter narrows to float32
departs; a LayerNorm through the same path does not."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

import probe_layers


@pytest.mark.slow
def test_the_probe_names_a_float64_island_that_openvino_computes_in_float32(tmp_path, capsys):
    out = tmp_path / "probe.json"
    code = probe_layers.main(
        ["--layers", "island/float64-variance,norm/layernorm", "--paths", "torch,torch/openvino", "--json", str(out)]
    )
    assert code == 0
    results = json.loads(out.read_text())
    row = results["results"]["island/float64-variance"]
    assert row["torch"]["ok"]
    assert row["torch/openvino"]["tol_units"] > 1e3  # E[h^2] - E[h]^2 of h ~ 1e4 in float32: ~10 off, not 1e-5
    assert results["results"]["norm/layernorm"]["torch/openvino"]["ok"]
    assert [(d["layer"], d["path"]) for d in results["departures"]] == [("island/float64-variance", "torch/openvino")]
    assert "DEPARTS x" in capsys.readouterr().out


def test_an_unknown_path_is_refused_with_exit_code_2(capsys):
    assert probe_layers.main(["--paths", "torch/nowhere"]) == 2
    assert "no path matches torch/nowhere" in capsys.readouterr().err


def test_workers_that_run_past_their_time_are_said_in_one_line_with_exit_code_1(monkeypatch, capsys):
    monkeypatch.setattr(probe_layers, "WORKER_TIMEOUT_S", 0.5)  # no worker imports its framework that fast
    assert probe_layers.main(["--layers", "norm/layernorm", "--paths", "torch"]) == 1
    err = capsys.readouterr().err
    assert "torch ref worker ran past 0.5 s and was stopped" in err
    assert "every worker failed" in err and "Traceback" not in err and "workers.log" not in err


def test_a_layer_pattern_matching_nothing_is_refused_with_exit_code_2(capsys):
    assert probe_layers.main(["--layers", "no-such-layer", "--paths", "torch"]) == 2
    assert "no layer matches --layers no-such-layer" in capsys.readouterr().err

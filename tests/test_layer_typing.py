"""`parity init` types the layers of a user's torch model, and each typed layer's NumPy declared form computes
what the real torch layer computes (float64, random weights): users' models get cause tests without editing."""

from __future__ import annotations

import numpy as np
from click.testing import CliRunner

from parity.cli import cli
from parity.model.workspace import Workspace
from tests.conftest import REPO

BUGS = REPO / "tests" / "converterbugs.py"


def test_init_types_each_layer_and_the_declared_forms_reproduce_torch(tmp_path):
    import torch

    from parity.diagnose.cause import layer_weights
    from parity.diagnose.layers import get
    from tests.converterbugs import make_typed_net

    result = CliRunner().invoke(cli, ["init", "typed", "--workspace", str(tmp_path), "--torch",
                                      f"{BUGS}:make_typed_net", "--input", "x=2x4x8x8"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    spec = Workspace(tmp_path).load_spec("typed", attach_golden=False)
    kinds = {tap: layer.kind for tap, layer in spec.layers.items()}
    assert kinds == {"conv": "conv", "depthwise": "conv", "bn": "batch_norm", "relu": "activation",
                     "maxpool": "pool", "avgpool": "pool", "up": "resize", "flat": "flatten", "drop": "dropout", "dense": "dense",
                     "norm": "layer_norm", "act": "activation", "leaky": "activation", "head": "dense"}
    net = make_typed_net().double()
    weights = {k: v.numpy() for k, v in net.state_dict().items()}
    x = torch.randn(2, 4, 8, 8, dtype=torch.float64)
    outputs = {}

    def keep(name):
        def hook(module, args, output):  # returns None: the output is left as it is
            outputs[name] = (args[0].numpy(), output.numpy())

        return hook

    hooks = [m.register_forward_hook(keep(n)) for n, m in net.named_children()]
    with torch.no_grad():
        net(x)
    for hook in hooks:
        hook.remove()
    for tap, layer in spec.layers.items():
        own = layer_weights(weights, layer.params, layer.kind) if layer.params else {}
        computed = get(layer.kind).forward([outputs[tap][0]], own, dict(layer.attrs))
        assert np.allclose(computed, outputs[tap][1], rtol=1e-10, atol=1e-12), tap

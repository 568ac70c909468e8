"""Real architectures as a user brings them: built from their packages' own constructors with random weights.

Frameworks are imported inside the factories: this file is imported by worker processes by path (``parity init
--torch tests/realmodels.py:make_bert``). Configurations are small, so the tests and ``scripts/real_models.py``
run on a laptop CPU; the architectures are the packages' own, unchanged.
"""

from __future__ import annotations

from pathlib import Path

VOCAB = 512  # the small configurations' vocabulary; token ids are drawn from 0 to VOCAB - 1


def make_bert():
    """A small ``transformers.BertModel``: input_ids, attention_mask, token_type_ids -> last_hidden_state,
    pooler_output."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return BertModel(config).eval()


def make_gpt2():
    """A small ``transformers.GPT2LMHeadModel`` without its key/value cache: input_ids, attention_mask -> logits."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2, use_cache=False, attn_implementation="eager"
    )
    return GPT2LMHeadModel(config).eval()


def make_resnet18():
    """``torchvision.models.resnet18(weights=None)``."""
    import torch
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


def make_mobilenet_v3_small():
    """``torchvision.models.mobilenet_v3_small(weights=None)``."""
    import torch
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.mobilenet_v3_small(weights=None).eval()


def make_hf_resnet18():
    """ResNet-18 (basic blocks, depths 2-2-2-2) as ``transformers.ResNetForImageClassification``: pixel_values ->
    logits. The same architecture as torchvision's, from a package that installs beside a CPU-only torch."""
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    config = ResNetConfig(
        embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic", num_labels=10
    )
    return ResNetForImageClassification(config).eval()


def make_hf_mobilenet_v2():
    """``transformers.MobileNetV2ForImageClassification`` (depth multiplier 0.35): pixel_values -> logits."""
    import torch
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    torch.manual_seed(0)
    config = MobileNetV2Config(depth_multiplier=0.35, image_size=96, num_labels=10)
    return MobileNetV2ForImageClassification(config).eval()


def save_keras_mobilenet_v2(path, size: int = 96) -> Path:
    """``keras.applications.MobileNetV2(weights=None)`` at ``size``x``size`` (NHWC), saved as ``.keras``."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(input_shape=(size, size, 3), alpha=0.35, weights=None, classes=10)
    path = Path(path)
    model.save(path)
    return path


def _flax_cnn():
    import flax.linen as nn

    class SmallCNN(nn.Module):
        """A Flax linen CNN (NHWC): conv, ReLU, mean pool, dense."""

        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(features=8, kernel_size=(3, 3), name="conv")(x))
            x = x.mean(axis=(1, 2))
            return nn.Dense(features=10, name="head")(x)

    return SmallCNN()


def save_flax_params(path, size: int = 16) -> Path:
    """The Flax model's parameters from ``init`` (seed 0), flattened to ``layer/variable`` keys in a ``.npz``."""
    import jax
    import numpy as np

    variables = _flax_cnn().init(jax.random.PRNGKey(0), np.zeros((1, size, size, 3), np.float32))
    flat = {
        "/".join(str(getattr(k, "key", k)) for k in key): np.asarray(value)
        for key, value in jax.tree_util.tree_flatten_with_path(variables["params"])[0]
    }
    path = Path(path)
    np.savez(path, **flat)
    return path


def flax_apply(params, x):
    """``apply(params, x)`` as ``parity init --jax`` takes it: the Flax module applied with its params."""
    return _flax_cnn().apply({"params": params}, x)

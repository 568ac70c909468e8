"""Trained models the int8 paths are proven on, each written as a user brings one: a workspace with the factory
file, the trained weights in the model's own format and an inputs ``.npz`` whose eval split stands apart.

All three learn scikit-learn's 8x8 digits (shipped with the package, nothing downloaded), split as parity's own
zoo splits them (``parity.model.digits``: 1348 training, 449 held-out samples), in seconds on a 2-core CPU:

- ``resnet``: ``transformers.ResNetForImageClassification`` (basic blocks, two stages), the digit upsampled to
  32x32 and repeated over three channels; saved with ``save_pretrained`` (``config.json``, ``model.safetensors``).
- ``bert``: ``transformers.BertForSequenceClassification``; each image is a sequence of 64 tokens after a
  ``[CLS]`` token, one per pixel, its id naming the pixel's place and its intensity in ``LEVELS`` buckets (BERT's
  own position embeddings add the place in the sequence).
- ``outlier_mlp``: a 64-64-32-10 MLP whose first hidden layer has one channel scaled up ``OUTLIER`` times, the
  next layer's weights on that channel divided by as much: the float function is unchanged, but a per-tensor
  int8 range of that activation is set by the one channel and rounds every other channel to zero.

This file is copied into each workspace and named by ``parity init --torch int8models.py:make_<name>``: the
factories read the weights beside it. Frameworks are imported inside functions (workers import it by path).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np

NAMES = ("resnet", "bert", "outlier_mlp")
OUTLIER = 1000.0  # the outlier channel's scale: far beyond what 8 bits of one shared range can hold beside the rest
LEVELS = 4  # intensity buckets of a pixel token: 0-3, 4-7, 8-11, 12-16 (of 16)
CLS = 0  # the [CLS] token id; pixel p at bucket b is 1 + p * LEVELS + b
VOCAB = 1 + 64 * LEVELS
SEQUENCE = 65  # [CLS] + 64 pixels
IMAGE = 32  # the ResNet's input size: the 8x8 digit upsampled 4x
HERE = Path(__file__).resolve().parent


# --- the factories ``parity init`` names: build the architecture, load the trained weights beside this file ---


def make_resnet():
    """The trained ResNet, from the folder ``save_pretrained`` wrote: pixel_values (N, 3, 32, 32) -> logits."""
    from transformers import ResNetForImageClassification

    return ResNetForImageClassification.from_pretrained(HERE / "resnet", local_files_only=True).eval()


def make_bert():
    """The trained BERT classifier (eager attention), from its ``save_pretrained`` folder: input_ids (N, 65) ->
    logits."""
    from transformers import BertForSequenceClassification

    return BertForSequenceClassification.from_pretrained(
        HERE / "bert", local_files_only=True, attn_implementation="eager"
    ).eval()


def make_outlier_mlp():
    """The trained MLP with its outlier channel, weights from ``outlier_mlp.safetensors``: x (N, 64) -> logits."""
    from safetensors.torch import load_file

    model = _mlp()
    model.load_state_dict(load_file(HERE / "outlier_mlp.safetensors"))
    return model.eval()


def _mlp():
    import torch
    from torch import nn

    class OutlierMLP(nn.Module):
        """Three Linear layers with ReLU between them; named children are the taps the diagnosis compares."""

        def __init__(self):
            super().__init__()
            self.fc1, self.act1 = nn.Linear(64, 64), nn.ReLU()
            self.fc2, self.act2 = nn.Linear(64, 32), nn.ReLU()
            self.head = nn.Linear(32, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.act2(self.fc2(self.act1(self.fc1(x)))))

    return OutlierMLP()


# --- the data each model reads: the digits, as image, token sequence or flat vector ---


def images(flat: np.ndarray) -> np.ndarray:
    """(N, 64) pixels in 0..1 -> (N, 3, 32, 32) float32: each pixel a 4x4 block, the grey image on three channels,
    centred and scaled as image models take them."""
    x = flat.reshape(-1, 1, 8, 8).repeat(IMAGE // 8, axis=2).repeat(IMAGE // 8, axis=3)
    return np.repeat((x - 0.5) / 0.5, 3, axis=1).astype(np.float32)


def tokens(flat: np.ndarray) -> np.ndarray:
    """(N, 64) pixels in 0..1 -> (N, 65) int64 ids: ``[CLS]`` then one token per pixel, its place and intensity
    bucket."""
    buckets = np.minimum(np.rint(flat * 16).astype(np.int64) // 4, LEVELS - 1)
    ids = 1 + np.arange(64) * LEVELS + buckets
    return np.concatenate([np.full((len(ids), 1), CLS, np.int64), ids], axis=1)


INPUTS = {  # model -> (its input's name, the data as it takes it)
    "resnet": ("pixel_values", images),
    "bert": ("input_ids", tokens),
    "outlier_mlp": ("x", lambda flat: flat.astype(np.float32)),
}


# --- training ---


def _new_model(name: str):
    import torch

    torch.manual_seed(0)
    if name == "resnet":
        from transformers import ResNetConfig, ResNetForImageClassification

        config = ResNetConfig(
            num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=10
        )
        return ResNetForImageClassification(config)
    if name == "bert":
        from transformers import BertConfig, BertForSequenceClassification

        config = BertConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=SEQUENCE,
            num_labels=10,
            initializer_range=0.2,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            attn_implementation="eager",
        )
        return BertForSequenceClassification(config)
    return _mlp()


# model -> (epochs, learning rate, batch); BERT starts from wider weights (initializer_range) to learn in 5 epochs
TRAINING = {"resnet": (6, 3e-3, 64), "bert": (5, 2e-3, 32), "outlier_mlp": (25, 3e-3, 64)}


def _logits(model, x):
    out = model(x)
    return out if not hasattr(out, "logits") else out.logits


def train(name: str, epochs: int | None = None) -> tuple[object, dict]:
    """Train ``name`` on the digits' training split; ``(model in eval mode, facts)`` with the held-out accuracy
    and the seconds training took."""
    import torch

    from parity.model.digits import digits_split

    split = digits_split((64,))
    _, convert = INPUTS[name]
    dtype = torch.long if name == "bert" else torch.float32
    x, y = torch.tensor(convert(split.train_x), dtype=dtype), torch.tensor(split.train_y)
    default_epochs, rate, batch_size = TRAINING[name]
    model = _new_model(name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=rate)
    epochs = epochs or default_epochs
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs * -(-len(x) // batch_size))
    generator = torch.Generator().manual_seed(0)
    started = time.perf_counter()
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(batch_size):
            loss = torch.nn.functional.cross_entropy(_logits(model, x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    seconds = time.perf_counter() - started
    model.eval()
    eval_x = torch.tensor(convert(split.eval_x), dtype=dtype)
    facts = {"train_s": seconds, "epochs": epochs, "train": len(x), "eval": len(split.eval_y)}
    if name == "outlier_mlp":
        with torch.no_grad():
            before = model(eval_x)
            facts["outlier_channel"] = _plant_outlier(model)
            facts["outlier_logits_change"] = float((model(eval_x) - before).abs().max())  # float32 rounding only
    with torch.no_grad():
        facts["accuracy"] = float((_logits(model, eval_x).argmax(1).numpy() == split.eval_y).mean())
    return model, facts


def _plant_outlier(model) -> int:
    """Scale the first hidden layer's busiest channel by ``OUTLIER`` and divide the next layer's weights on it by
    as much (ReLU commutes with a positive scale): the same function, one activation channel ~1000x the others.
    Returns the channel."""
    import torch

    from parity.model.digits import digits_split

    with torch.no_grad():
        hidden = model.act1(model.fc1(torch.tensor(digits_split((64,)).train_x, dtype=torch.float32)))
        channel = int(hidden.mean(0).argmax())
        model.fc1.weight[channel] *= OUTLIER
        model.fc1.bias[channel] *= OUTLIER
        model.fc2.weight[:, channel] /= OUTLIER
    return channel


# --- a workspace per model ---


def build_workspace(name: str, root: Path, epochs: int | None = None) -> dict:
    """Train ``name`` and write its workspace into ``root``: this file (the factory), the weights, and
    ``inputs.npz`` (the input's training samples and ``labels``, which calibrate, and ``eval_<input>`` /
    ``eval_labels``, the held-out split the accuracy gate scores). Returns the facts of training and the
    ``parity init`` arguments after the model's name."""
    from parity.model.digits import digits_split

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    model, facts = train(name, epochs)
    if name == "outlier_mlp":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, root / "outlier_mlp.safetensors")
    else:
        model.save_pretrained(root / name, safe_serialization=True)
    split = digits_split((64,))
    input_name, convert = INPUTS[name]
    np.savez(
        root / "inputs.npz",
        **{
            input_name: convert(split.train_x),
            "labels": split.train_y,
            f"eval_{input_name}": convert(split.eval_x),
            "eval_labels": split.eval_y,
        },
    )
    shutil.copy(Path(__file__), root / "int8models.py")
    return {**facts, "init": ["--torch", f"int8models.py:make_{name}", "--inputs", "inputs.npz"]}

"""A pretrained edge encoder's file: what `splitrl pretrain-encoder` writes and `--encoder-init` reads.

Kept apart from edge_encoder.pretrain (which plays an env) so the edge-encoder service reads the file without
importing gymnasium. Invariant: a file holds the encoder's weights with the ModelConfig they fit, and
`load_pretrained` refuses any other shapes by name.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from splitrl.core import checkpoint
from splitrl.core.models import Encoder
from splitrl.core.spec import ModelConfig


@dataclass(frozen=True)
class PretrainResult:
    """How a pretraining went: `steps` Adam steps in `seconds` (collecting not included) on `stacks` frame stacks,
    the last `held_out` of them not trained on; mean squared error per pixel (frames scaled to [0, 1]) on those:
    the autoencoder's, and that of predicting each as the training stacks' mean (an encoder carrying nothing)."""

    steps: int
    stacks: int
    held_out: int
    held_out_mse: float
    mean_predictor_mse: float
    seconds: float


def save_pretrained(path: Path, encoder: Encoder, model: ModelConfig, env_id: str, result: PretrainResult) -> None:
    """Write the encoder's weights, the ModelConfig they fit and how they were made (atomically)."""
    checkpoint.save(
        {"encoder": encoder.state_dict(), "model": asdict(model), "env": env_id, "result": asdict(result)},
        path,
        keep=1,  # the user's own file: no older generations beside it
    )


def load_pretrained(path: Path, model: ModelConfig, env_id: str) -> dict[str, torch.Tensor]:
    """The encoder weights in `path` (written by `splitrl pretrain-encoder`). FileNotFoundError if there is no
    file; ValueError if it is not such a file, or was made for other shapes than `model` or another env."""
    try:
        state = checkpoint.load(path, keep=1)
    except Exception as error:  # torch.load of a foreign file: EOFError, UnpicklingError, RuntimeError, ...
        raise ValueError(f"{path} is not a pretrained encoder file: {type(error).__name__}: {error}") from None
    if state is None:
        raise FileNotFoundError(f"no pretrained encoder at {path} (write one with `splitrl pretrain-encoder`)")
    if not isinstance(state, dict) or not {"encoder", "model", "env"} <= state.keys():
        raise ValueError(f"{path} is not a pretrained encoder file (no 'encoder', 'model' and 'env' entries)")
    if state["model"] != asdict(model):
        raise ValueError(f"{path} holds an encoder for {state['model']}, but this run's is {asdict(model)}")
    if state["env"] != env_id:
        raise ValueError(f"{path} holds an encoder pretrained on {state['env']!r}, but this run's env is {env_id!r}")
    encoder: dict[str, torch.Tensor] = state["encoder"]
    return encoder


def quality(result: PretrainResult) -> float:
    """Share of the mean predictor's error the autoencoder removes on held-out stacks (1: perfect; 0: none)."""
    return 1.0 - result.held_out_mse / result.mean_predictor_mse if result.mean_predictor_mse > 0 else math.nan

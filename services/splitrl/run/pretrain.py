"""`splitrl pretrain-encoder`: a random policy's frames, an autoencoder's encoder half, a file for --encoder-init.

The pieces are the edge's (edge_encoder.pretrain, edge_encoder.pretrained); this module only wires a run's
settings to them, as `splitrl up` wires them to services.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from splitrl.edge_encoder.pretrain import RandomPolicy, collect_stacks, pretrain
from splitrl.edge_encoder.pretrained import PretrainResult, save_pretrained
from splitrl.run.settings import PretrainSettings

log = logging.getLogger(__name__)


def pretrain_encoder(settings: PretrainSettings) -> PretrainResult:
    """Collect settings.random_steps agent steps, pretrain, write settings.out. The seed fixes the tracks, the
    random actions, the initial weights and the batches drawn."""
    torch.set_num_threads(settings.torch_threads)
    torch.manual_seed(settings.seed)
    model = settings.network_config()
    actions = np.random.default_rng(settings.seed)

    def random_policy(space: gym.Space[Any]) -> Callable[[], Any]:
        return RandomPolicy(space, settings.random_action_hold, settings.random_action_weights, actions)

    started = time.perf_counter()
    rows = collect_stacks(
        settings.env,
        settings.env_kwargs,
        model,
        settings.action_repeat,
        settings.random_steps,
        random_policy,
        settings.seed,
    )
    log.info("%d frame stacks from a random policy in %.0f s", len(rows), time.perf_counter() - started)
    encoder = model.encoder()
    sampler = torch.Generator().manual_seed(settings.seed)
    result = pretrain(
        encoder,
        model,
        rows,
        settings.pretrain_steps,
        settings.pretrain_batch_size,
        settings.pretrain_learning_rate,
        sampler,
    )
    save_pretrained(settings.out, encoder, model, settings.env, result)
    return result

"""The policy inference runs: the head alone (split modes) or encoder + head (cloud), acting in torch or in ONNX
Runtime (core.onnx_forward: the same outputs within float32 rounding, in about half the CPU at a few rows)."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, get_args

import torch

from splitrl.core.config import Mode
from splitrl.core.models import ActorCritic, ActorCriticHead, cloud_network
from splitrl.core.rpc import BadRequest
from splitrl.core.spec import ActionSpec, ModelConfig
from splitrl.inference.settings import ActingRuntime

if TYPE_CHECKING:
    from splitrl.core.onnx_forward import ForwardGraph, Session

log = logging.getLogger(__name__)


@dataclass
class Decisions:
    """What the policy decided for a batch of B rows."""

    actions: torch.Tensor  # int64 [B] or float32 [B, A]
    log_probs: torch.Tensor  # float32 [B]
    values: torch.Tensor  # float32 [B]
    policy_version: int  # the version whose weights produced these decisions


@dataclass(frozen=True)
class PreparedWeights:
    """One version's weights, ready to swap in: the state_dict, and the ONNX Runtime session holding them (None
    when acting in torch)."""

    state_dict: dict[str, torch.Tensor]
    session: Session | None


class Policy:
    """Samples actions. `version` counts the weight updates applied (0 = initial weights).

    New weights come in two steps: `prepare` (one thread beside acting, the weights thread; with ONNX Runtime it
    builds the session, ~10-70 ms for CarRacing) and `load` (the acting thread, between two batches: a swap and a
    copy into the torch network). With runtime "onnxruntime" the policy acts in torch until the first prepared
    weights are loaded: onnx and onnxruntime are imported by the first `prepare`, not before a service serves."""

    def __init__(
        self,
        mode: Mode,
        model: ModelConfig,
        action_spec: ActionSpec,
        seed: int,
        *,
        runtime: ActingRuntime,
        threads: int = 1,
    ) -> None:
        """`mode` decides what it acts on (core.models.cloud_network): frame stacks in cloud mode, activations
        in the split modes. `seed` sets the initial weights (the learner's, same seed, match) and sampling.
        `runtime` runs the acting pass, on `threads` threads in ONNX Runtime (torch's are set per process)."""
        if runtime not in get_args(ActingRuntime):
            raise ValueError(f"runtime must be 'onnxruntime' or 'torch', got {runtime!r}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.manual_seed(seed)
        self.network = cloud_network(mode, model, action_spec)
        self.network.eval()
        self.action_spec = action_spec
        self.runtime = runtime
        self.version = 0
        self._generator = torch.Generator().manual_seed(seed)
        # Where the action distribution comes from when ONNX Runtime ran the layers.
        head = self.network.head if isinstance(self.network, ActorCritic) else self.network
        assert isinstance(head, ActorCriticHead), type(head)
        self._head = head
        self._threads = threads
        self._graph: ForwardGraph | None = None  # written by the first prepare
        # The weights thread's own copy, to try new weights on without touching the one acting.
        self._probe_network = copy.deepcopy(self.network)
        self._probe_inputs = _probe_inputs(mode, model)
        self._session: Session | None = None  # None: acting in torch

    def prepare(self, state_dict: dict[str, torch.Tensor]) -> PreparedWeights:
        """`state_dict` (validated by the caller) made ready for `load`. Call it from one thread at a time; it
        runs beside `act`."""
        if self.runtime == "torch":
            return PreparedWeights(state_dict, None)
        try:
            if self._graph is None:
                from splitrl.core.onnx_forward import ForwardGraph  # onnx and onnxruntime: ~0.5-0.9 s to import

                self._graph = ForwardGraph(self.network, self._threads)
            return PreparedWeights(state_dict, self._graph.session(state_dict))
        except Exception:  # ONNX Runtime only makes acting cheaper: torch acts with these weights instead
            log.exception("no ONNX Runtime session for these weights; torch acts with them")
            return PreparedWeights(state_dict, None)

    @property
    def acting_in(self) -> ActingRuntime:
        """What runs the acting pass now: "torch" until prepared weights with an ONNX Runtime session are loaded."""
        return "torch" if self._session is None else "onnxruntime"

    def weights_now(self) -> tuple[dict[str, torch.Tensor], int]:
        """A copy of the weights acted with now and their version, for `prepare`; call it where `act` runs."""
        return {name: value.clone() for name, value in self.network.state_dict().items()}, self.version

    def check_outputs(self, state_dict: dict[str, torch.Tensor]) -> None:
        """BadRequest unless `state_dict` gives a valid action distribution, finite values, and finite sampled
        actions and log-probabilities on the probe inputs (blank and saturated observations): finite weights can
        still overflow float32 on the way through the layers, and acting with them would fail every request or
        poison every chunk. Call it from the weights thread, beside `act`."""
        self._probe_network.load_state_dict(state_dict)
        try:
            with torch.no_grad():
                distribution, values = self._probe_network(self._probe_inputs)
                # A Gaussian accepts an infinite scale: its samples and their log-probabilities show it.
                actions = distribution.sample()
                outputs = {"values": values, "actions": actions, "log-probabilities": distribution.log_prob(actions)}
        except ValueError as error:  # torch's distributions refuse non-finite parameters as they are made
            raise BadRequest(
                f"these weights give no valid action distribution on probe observations: {error}"
            ) from None
        for name, output in outputs.items():
            if not bool(torch.isfinite(output).all()):
                raise BadRequest(f"these weights give non-finite {name} on probe observations")

    def load(self, weights: PreparedWeights, version: int, *, rewind: bool = False) -> None:
        """Swap in new weights; later batches act with them as `version`. A version older than the current one is
        refused (BadRequest) unless `rewind`, so versions never go back on their own: a rewind is a learner resumed
        from an older checkpoint, allowed on a Publish stream's first message. The same version again is taken.
        Call it where `act` runs, not beside it."""
        if version < self.version and not rewind:
            raise BadRequest(f"Weights.version {version} is older than {self.version}")
        if version < self.version:
            log.warning(
                "weights version %d replaces %d: a learner resumed from an older checkpoint", version, self.version
            )
        self.network.load_state_dict(weights.state_dict)
        self._session = weights.session
        self.version = version

    @torch.no_grad()
    def act(self, observations: torch.Tensor) -> Decisions:
        """observations: uint8 stacks [B, stack, S, S] (cloud) or activations [B, width] (split)."""
        distribution, values = self._forward(observations)
        if self.action_spec.kind == "discrete":
            probs = distribution.probs  # type: ignore[attr-defined]
            actions = torch.multinomial(probs, 1, generator=self._generator).squeeze(-1)
        else:
            base = distribution.base_dist  # type: ignore[attr-defined]
            noise = torch.randn(base.loc.shape, generator=self._generator)
            actions = base.loc + base.scale * noise
        return Decisions(actions, distribution.log_prob(actions).float(), values.float(), self.version)

    def _forward(self, observations: torch.Tensor) -> tuple[torch.distributions.Distribution, torch.Tensor]:
        if self._session is None:
            return self.network(observations)  # type: ignore[no-any-return]
        outputs = self._session.run(observations)
        return self._head.distribution(outputs.logits_or_mean), outputs.value


def _probe_inputs(mode: Mode, model: ModelConfig) -> torch.Tensor:
    """Two observations at the ends of their range: frame stacks all black and all white (cloud), or activations
    all 0 and all 1 (split modes)."""
    if mode == "cloud":
        shape = (model.frame_stack, model.frame_size, model.frame_size)
        return torch.stack([torch.zeros(shape, dtype=torch.uint8), torch.full(shape, 255, dtype=torch.uint8)])
    return torch.stack([torch.zeros(model.width), torch.ones(model.width)]).to(torch.bfloat16)

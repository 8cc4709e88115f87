"""What a trajectory chunk of one run may hold, beyond its shapes: the content checks replay applies before it
stores (and acknowledges) a chunk, so nothing poisonous reaches the learner.

`trajectory.check` proves a chunk is well-formed (dtypes, row counts); `ChunkLimits.check` proves it could
have come from a run of this spec: actions inside the action space, rewards, values and log-probabilities
finite and within bounds training can produce, versions and step ids that are counts, and observations of the
run's shape. Torch-free (replay does not load torch): the small fields are read as numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitrl.core import wire
from splitrl.core.rpc import BadRequest
from splitrl.core.spec import ActionSpec, ModelConfig
from splitrl.v1 import replay_pb2

#: |log pi(a|s)| above this is refused: an action of probability e**-80 is never sampled, and PPO's ratio
#: exp(new - old) must stay finite in float32 (exp overflows past ~88), or every step that reads it is lost.
MAX_ABS_LOG_PROB = 80.0
#: Continuous actions are the policy's raw samples (the environment clips them), so they may leave the box by a
#: few standard deviations, never by orders of magnitude.
ACTION_SLACK = 100.0


def stored_observation_shape(cloud: bool, model: ModelConfig) -> tuple[int, ...]:
    """One step's observation as a chunk stores it: a frame stack (D, H, W) where the cloud runs the encoder
    (cloud mode), the encoder's activations (width,) where the edge does (the split modes)."""
    return (model.frame_stack, model.frame_size, model.frame_size) if cloud else (model.width,)


@dataclass(frozen=True)
class ChunkLimits:
    """The bounds one run's chunks stay within. `action_spec` None: actions are only checked to be counts
    (discrete) or finite (continuous); `observation_shape` None: any; one step's shape otherwise ((D, H, W)
    uint8 frame stacks, or (width,) activations)."""

    action_spec: ActionSpec | None = None
    observation_shape: tuple[int, ...] | None = None
    #: Largest |reward| of one agent step (summed over its action repeat).
    max_abs_reward: float = 1e6
    #: Largest |value estimate|: a discounted return of max_abs_reward for ~1,000 steps, with room.
    max_abs_value: float = 1e9

    def __post_init__(self) -> None:
        if not (self.max_abs_reward > 0 and self.max_abs_value > 0):
            raise ValueError(f"bounds must be positive, got {self.max_abs_reward} and {self.max_abs_value}")

    def check(self, message: replay_pb2.Trajectory) -> None:
        """BadRequest naming the first field of `message` (already `trajectory.check`ed) beyond these limits."""
        self._check_actions(_read(message, "actions"))
        _within(message, "rewards", self.max_abs_reward)
        _within(message, "values", self.max_abs_value)
        log_probs = _within(message, "behaviour_log_probs", MAX_ABS_LOG_PROB)
        if self.action_spec is not None and self.action_spec.kind == "discrete" and (log_probs > 0).any():
            raise BadRequest("Trajectory.behaviour_log_probs holds values above 0: not a discrete probability")
        for name in ("policy_versions", "encoder_versions", "step_ids"):
            if (_read(message, name) < 0).any():
                raise BadRequest(f"Trajectory.{name} holds negative values; they are counts")
        self._check_observations(message)

    def _check_actions(self, actions: np.ndarray) -> None:
        spec = self.action_spec
        if actions.dtype.kind in "iu":
            if spec is not None and spec.kind != "discrete":
                raise BadRequest(f"Trajectory.actions are integers; this run acts with {_described(spec)}")
            bound = spec.size if spec is not None else None
            low, high = actions.min(initial=0), actions.max(initial=0)
            if actions.ndim != 1 or low < 0 or (bound is not None and high >= bound):
                raise BadRequest(
                    f"Trajectory.actions must be [T] indices in [0, {bound or 'n'}); got {low}..{high} in shape "
                    f"{list(actions.shape)}"
                )
            return
        if not np.isfinite(actions).all():
            raise BadRequest("Trajectory.actions holds NaN or Inf")
        if spec is None:
            return
        if spec.kind != "continuous" or actions.ndim != 2 or actions.shape[1] != spec.size:
            raise BadRequest(
                f"Trajectory.actions has shape {list(actions.shape)}; this run acts with {_described(spec)}"
            )
        low, high = np.asarray(spec.low), np.asarray(spec.high)
        slack = ACTION_SLACK * np.maximum(high - low, 1.0)
        if ((actions < low - slack) | (actions > high + slack)).any():
            raise BadRequest(f"Trajectory.actions lie far outside the action space [{spec.low}, {spec.high}]")

    def _check_observations(self, message: replay_pb2.Trajectory) -> None:
        if self.observation_shape is None:
            return
        tensor = message.observations
        if message.HasField("observation_index"):  # frames [K, H, W] and an index [T+1, D]
            shape = (message.observation_index.shape[1], *tensor.shape[1:])
        else:
            shape = tuple(tensor.shape[1:])
        if tuple(shape) != self.observation_shape:
            raise BadRequest(
                f"Trajectory.observations are steps of shape {list(shape)}; "
                f"this run's are {list(self.observation_shape)}"
            )


def _described(spec: ActionSpec) -> str:
    if spec.kind == "discrete":
        return f"{spec.size} discrete actions"
    return f"{spec.size} continuous dimensions within {list(spec.low)}..{list(spec.high)}"


def _read(message: replay_pb2.Trajectory, name: str) -> np.ndarray:
    try:
        return wire.decode_array(getattr(message, name))
    except wire.WireError as error:
        raise wire.WireError(f"Trajectory.{name}: {error}") from None


def _within(message: replay_pb2.Trajectory, name: str, bound: float) -> np.ndarray:
    values = _read(message, name)
    if not np.isfinite(values).all():
        raise BadRequest(f"Trajectory.{name} holds NaN or Inf")
    largest = float(np.abs(values).max(initial=0.0))
    if largest > bound:
        raise BadRequest(f"Trajectory.{name} holds |{largest:.3g}|, above the bound {bound:.3g}")
    return values

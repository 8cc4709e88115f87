"""What edge and cloud must agree on, without torch: the action space, and the network's shapes.

The environment service (which never loads torch) describes its action space with `ActionSpec`;
`ModelConfig` is the shape of the split network, built into torch modules by splitrl.core.models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from splitrl.core.models import Encoder

#: The encoder's last layer. relu: activations >= 0, unbounded. layernorm: each row normalised to mean 0 and
#: variance 1 (no learned gain), so |activation| <= sqrt(width - 1) whatever the weights: a trained encoder cannot
#: inflate what it sends (a narrow ReLU encoder that trains can grow its activations by orders of magnitude, and the
#: policy then collapses).
Bottleneck = Literal["relu", "layernorm"]


@dataclass(frozen=True)
class ActionSpec:
    """The action space a policy acts in: `discrete` with `size` choices, or `continuous` with `size` dims."""

    kind: Literal["discrete", "continuous"]
    size: int
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("discrete", "continuous"):
            raise ValueError(f"ActionSpec.kind must be 'discrete' or 'continuous', got {self.kind!r}")
        if self.size < 1:
            raise ValueError(f"ActionSpec.size must be >= 1, got {self.size}")
        if self.kind == "continuous" and not (len(self.low) == len(self.high) == self.size):
            raise ValueError(f"continuous ActionSpec needs {self.size} low/high bounds, got {self.low}/{self.high}")

    @property
    def action_shape(self) -> tuple[int, ...]:
        """Shape of one env's action: () for discrete, (size,) for continuous."""
        return () if self.kind == "discrete" else (self.size,)


@dataclass(frozen=True)
class ModelConfig:
    """Shapes shared by edge and cloud; both ends must agree on them."""

    frame_stack: int = 4
    frame_size: int = 96
    width: int = 4096
    bottleneck: Bottleneck = "relu"

    def encoder(self) -> Encoder:
        from splitrl.core.models import Encoder  # torch: only the processes that run the network load it

        return Encoder(self.frame_stack, self.frame_size, self.width, self.bottleneck)

    def activation_bound(self, relu_bound: float) -> float:
        """Largest |activation| a healthy encoder sends: sqrt(width - 1) for layernorm (plus 1% for bf16
        rounding), `relu_bound` (a setting) for relu, whose outputs have no bound of their own."""
        if self.bottleneck == "layernorm":
            return max(self.width - 1, 1) ** 0.5 * 1.01
        return relu_bound

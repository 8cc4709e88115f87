"""Adam for the edge's encoder, without torch.optim.Optimizer's import cost.

torch.optim.Optimizer's methods are wrapped by torch._disable_dynamo, which imports torch._dynamo (and with
it sympy and mpmath, hundreds of modules) the first time one of them runs: tens of MB resident on an edge
whose budget is a few hundred.
`LeanAdam` runs the same update through torch's functional Adam (`torch.optim.adam.adam`, which imports
nothing outside torch.compile) and keeps its state in torch.optim.Adam's state_dict layout, so a checkpoint
written by either loads into the other and the steps after it are the same, bit for bit (tests/unit/
test_edge_optimizer.py). Only what the edge uses is offered: one parameter group, no weight decay, no amsgrad.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.optim.adam import adam

#: torch.optim.Adam options LeanAdam does not run; a state_dict whose group turns one on is refused.
UNSUPPORTED_OPTIONS = ("amsgrad", "weight_decay", "maximize", "fused", "capturable", "differentiable")


class LeanAdam:
    """Adam (Kingma & Ba; torch.optim.Adam's defaults and arithmetic) over one group of parameters.

    Invariants: `param_groups` holds one group whose "lr", "betas" and "eps" are the ones the next `step`
    uses; a parameter's state (step count, first and second moments) exists from its first step with a
    gradient, as in torch.optim.Adam.
    """

    def __init__(
        self, params: Iterable[torch.Tensor], *, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
    ) -> None:
        self.params = list(params)
        if not self.params:
            raise ValueError("LeanAdam needs at least one parameter, got none")
        if not lr >= 0.0:  # NaN fails too
            raise ValueError(f"LeanAdam lr must be >= 0, got {lr}")
        if not eps >= 0.0:
            raise ValueError(f"LeanAdam eps must be >= 0, got {eps}")
        if len(betas) != 2 or not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"LeanAdam betas must be two numbers in [0, 1), got {betas}")
        # torch.optim.Adam's group keys, so its load_state_dict takes this one's state_dict as its own.
        self.param_groups: list[dict[str, Any]] = [
            {
                "lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0, "amsgrad": False, "maximize": False,
                "foreach": None, "capturable": False, "differentiable": False, "fused": None,
                "decoupled_weight_decay": False,
            }
        ]  # fmt: skip
        self.state: dict[int, dict[str, torch.Tensor]] = {}  # parameter index -> step, exp_avg, exp_avg_sq

    def zero_grad(self) -> None:
        """Forget the parameters' gradients (set to None, as torch.optim's default)."""
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step for every parameter that has a gradient, at the group's current "lr"."""
        group = self.param_groups[0]
        indices: list[int] = []
        grads: list[torch.Tensor] = []
        for i, param in enumerate(self.params):
            if param.grad is not None:
                indices.append(i)
                grads.append(param.grad)
        for i in indices:
            if i not in self.state:
                self.state[i] = {
                    "step": torch.tensor(0.0),
                    "exp_avg": torch.zeros_like(self.params[i], memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(self.params[i], memory_format=torch.preserve_format),
                }
        adam(
            [self.params[i] for i in indices],
            grads,
            [self.state[i]["exp_avg"] for i in indices],
            [self.state[i]["exp_avg_sq"] for i in indices],
            [],
            [self.state[i]["step"] for i in indices],
            amsgrad=False,
            beta1=group["betas"][0],
            beta2=group["betas"][1],
            lr=group["lr"],
            weight_decay=0.0,
            eps=group["eps"],
            maximize=False,
        )

    def state_dict(self) -> dict[str, Any]:
        """torch.optim.Adam's layout: {"state": {index: {...}}, "param_groups": [{..., "params": [indices]}]}."""
        group = {**self.param_groups[0], "params": list(range(len(self.params)))}
        return {"state": {i: dict(state) for i, state in self.state.items()}, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take the state and hyperparameters of a LeanAdam's or a one-group torch.optim.Adam's state_dict over
        the same parameters; ValueError, changing nothing, when it is not one."""
        groups = state_dict.get("param_groups")
        if not isinstance(groups, list) or len(groups) != 1:
            count = len(groups) if isinstance(groups, list) else groups
            raise ValueError(f"LeanAdam loads one parameter group, got {count}")
        (group,) = groups
        saved_count, count = len(group.get("params", ())), len(self.params)
        if saved_count != count:
            raise ValueError(f"the state_dict is for {saved_count} parameters; this LeanAdam has {count}")
        unsupported = [key for key in UNSUPPORTED_OPTIONS if group.get(key)]
        if unsupported:  # their steps differ from the plain single-tensor / foreach Adam this one runs
            raise ValueError(f"LeanAdam has no {', '.join(unsupported)}; the state_dict's group uses them")
        position = {saved: i for i, saved in enumerate(group["params"])}
        state = {}
        for saved, entry in state_dict.get("state", {}).items():
            if saved not in position or not {"step", "exp_avg", "exp_avg_sq"} <= entry.keys():
                raise ValueError(f"the state_dict's state for parameter {saved!r} is not Adam's over {group['params']}")
            param = self.params[position[saved]]
            state[position[saved]] = {
                # torch.optim.Adam's step count: a scalar in the default float dtype, on the CPU
                "step": torch.as_tensor(entry["step"]).detach().to("cpu", torch.get_default_dtype(), copy=True),
                "exp_avg": entry["exp_avg"].detach().to(param.device, param.dtype, copy=True),
                "exp_avg_sq": entry["exp_avg_sq"].detach().to(param.device, param.dtype, copy=True),
            }
        self.state = state
        self.param_groups[0].update(lr=group["lr"], betas=tuple(group["betas"]), eps=group["eps"])

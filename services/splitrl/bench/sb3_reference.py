"""The peer users already trust, beside splitrl: Stable-Baselines3 PPO on the same env, recipe and frame budget.

`splitrl bench learning --sb3-reference` trains it as one more row (`sb3-ppo`),
in the same run-directory layout (settings.json, curve.jsonl, evals.jsonl), so
its curve, evaluations and table row come out as splitrl's do; `splitrl bench
throughput --sb3-reference` times it (`measure_sb3`). Stable-Baselines3 is an
optional extra (`pip install "splitrl[sb3]"`), imported only here.

What is the same as splitrl's cloud mode: the env (splitrl.core.envs.make_env:
gray, resized, the fast action repeat), the frame stack, the network (Nature
CNN, a 512-unit layer, linear actor and critic heads, orthogonal init), and the
PPO recipe: rollout = unroll_length x chunks_per_update agent steps, the same
minibatches, epochs, learning rate (and its linear anneal), gamma, GAE lambda, ratio clip, entropy (and its
anneal) and value weights, gradient-norm clip, per-minibatch advantage normalisation, Adam
eps 1e-5, reward_scale (applied after SB3's Monitor, which records the
unscaled returns), and with --env-workers envs stepped in other processes
(SB3's SubprocVecEnv: a process per env). What differs: SB3 steps and trains in turn in one process
(splitrl trains while it acts, so its data is up to ~2 updates old);
VecFrameStack starts an episode's stack with zeros where splitrl repeats the
first frame; and cloud mode's frames cross H.264 while SB3 sees them raw.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from splitrl.bench.baseline import BaselineResult, steady_span, update_pace
from splitrl.bench.segments import Budget, run_segments
from splitrl.core.envs import make_env
from splitrl.core.spec import ActionSpec
from splitrl.learner.algorithms import linear_anneal
from splitrl.run import files as run_dir_files
from splitrl.run.evaluate import evaluate_actor
from splitrl.run.settings import EvalSettings, RunSettings

ROW = "sb3-ppo"
MODEL_FILE = "sb3_ppo.zip"


def model_path(run_dir: Path) -> Path:
    """Where an SB3 row keeps its model in RUN_DIR (saved after each segment; its presence marks an SB3 run)."""
    return run_dir / "checkpoints" / MODEL_FILE


def require_sb3() -> Any:
    """The stable_baselines3 module; ValueError saying how to install it if it is missing."""
    try:
        import stable_baselines3
    except ImportError:
        raise ValueError(
            "--sb3-reference needs Stable-Baselines3, an optional extra: pip install 'splitrl[sb3]'"
        ) from None
    return stable_baselines3


def _vector_env(run: RunSettings, seed: int) -> Any:
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack

    def make(index: int) -> Any:
        def build() -> gym.Env[Any, Any]:
            env = make_env(run.env, run.env_kwargs, run.frame_size, run.action_repeat)
            env = gym.wrappers.ReshapeObservation(env, (run.frame_size, run.frame_size, 1))  # SB3 wants H, W, C
            env = Monitor(env)  # records the unscaled episode return
            env = gym.wrappers.TransformReward(env, lambda reward: float(reward) * run.reward_scale)
            env.reset(seed=seed + index)
            return env

        return build

    # --env-workers: splitrl steps its env groups in worker processes; SB3's own way is a process per env.
    vector = (SubprocVecEnv if run.env_workers else DummyVecEnv)([make(i) for i in range(run.num_envs)])
    vector.seed(seed)
    return VecFrameStack(vector, n_stack=run.frame_stack, channels_order="last")


def rollout_steps(run: RunSettings) -> int:
    """Agent steps per SB3 rollout (one update each, as splitrl's chunks_per_update chunks of unroll_length);
    ValueError unless every env gets the same share."""
    rollout = run.unroll_length * run.chunks_per_update
    if rollout % run.num_envs:
        raise ValueError(
            f"unroll_length x chunks_per_update ({rollout}) must be a multiple of num_envs ({run.num_envs})"
        )
    return rollout


class AnnealedRate:
    """SB3's learning-rate schedule for splitrl's `lr_anneal_steps`: `learning_rate` falling linearly to 0 at
    that many agent steps, counted from the model's own `num_timesteps` by `_steps_trained` (SB3's progress
    argument covers one learn() call, a segment; a loaded model goes on down the same line). `model` is set
    once the model exists, and is not pickled with it."""

    def __init__(self, learning_rate: float, anneal_steps: int) -> None:
        self.learning_rate, self.anneal_steps = learning_rate, anneal_steps
        self.model: Any = None

    def __call__(self, _progress_remaining: float) -> float:
        steps_trained = 0 if self.model is None else _steps_trained(self.model)
        return linear_anneal(self.learning_rate, steps_trained, self.anneal_steps)

    def __getstate__(self) -> dict[str, Any]:
        return {"learning_rate": self.learning_rate, "anneal_steps": self.anneal_steps, "model": None}


def _steps_trained(model: Any) -> int:
    """Agent steps the updates before the coming one trained on. SB3 asks for its rate (and the entropy
    callback runs) after collecting the coming update's rollout, so that is num_timesteps less one rollout:
    SB3's update k gets splitrl's value for the update after k updates."""
    return max(0, int(model.num_timesteps) - model.n_steps * model.n_envs)


def _entropy_anneal(run: RunSettings) -> Any:
    """A callback setting SB3's `ent_coef` before each update as splitrl's `entropy_anneal_steps` does (SB3 has
    no entropy schedule), or None when the recipe's entropy bonus is constant."""
    if run.entropy_anneal_steps is None:
        return None
    from stable_baselines3.common.callbacks import BaseCallback

    anneal_steps = run.entropy_anneal_steps

    class EntropyAnneal(BaseCallback):  # type: ignore[misc]
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:  # after collecting, before train()
            model: Any = self.model  # a PPO, which SB3 types as its base class
            model.ent_coef = linear_anneal(run.entropy_coef, _steps_trained(model), anneal_steps)

    return EntropyAnneal()


def _callbacks(run: RunSettings, curve_logger: Any) -> list[Any]:
    return [callback for callback in (curve_logger, _entropy_anneal(run)) if callback is not None]


def _with_schedule(model: Any) -> Any:
    """`model` with splitrl's learning-rate schedule bound to it (after a load it is unpickled unbound)."""
    if isinstance(model.learning_rate, AnnealedRate):
        model.learning_rate.model = model
    return model


def _learning_rate(run: RunSettings) -> float | AnnealedRate:
    return run.learning_rate if run.lr_anneal_steps is None else AnnealedRate(run.learning_rate, run.lr_anneal_steps)


def _new_model(run: RunSettings, venv: Any, seed: int) -> Any:
    from stable_baselines3 import PPO

    rollout = rollout_steps(run)
    return PPO(
        "CnnPolicy",
        venv,
        n_steps=rollout // run.num_envs,
        batch_size=rollout // run.minibatches,
        n_epochs=run.epochs,
        learning_rate=_learning_rate(run),
        gamma=run.gamma,
        gae_lambda=run.gae_lambda,
        clip_range=run.clip,
        ent_coef=run.entropy_coef,
        vf_coef=run.value_coef,
        max_grad_norm=run.max_grad_norm,
        seed=seed,
        device="cpu",
        verbose=0,
    )


#: A curve point before any step: what a fresh run's callback starts counting from.
ZERO_POINT = {"env_steps": 0.0, "episodes": 0.0, "return_sum": 0.0, "updates": 0.0, "seconds": 0.0}


def _curve_callback(offset: dict[str, float], every_steps: int, cpu: bool = False) -> Any:
    """Collects cumulative curve points as `splitrl up` writes them (no WAN bytes: one process), in `.points`;
    with `cpu`, each point also holds `cpu_seconds`, this process's CPU time (every thread) since training
    began (the bench's, not the learning curve's: a resumed run's would restart at 0)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class CurveLogger(BaseCallback):  # type: ignore[misc]
        def _on_training_start(self) -> None:
            self.point = dict(offset)
            self.points: list[dict[str, float]] = []
            self.clock = time.perf_counter() - offset["seconds"]
            self.cpu_clock = time.process_time()

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.point["episodes"] += 1
                    self.point["return_sum"] += float(info["episode"]["r"])
            self.point["env_steps"] = float(self.model.num_timesteps)
            if not self.points or self.point["env_steps"] - self.points[-1]["env_steps"] >= every_steps:
                self._take()
            return True

        def _on_rollout_end(self) -> None:
            self.point["updates"] += 1  # the update that follows this rollout

        def _on_training_end(self) -> None:
            self._take()

        def _take(self) -> None:
            self.point["seconds"] = round(time.perf_counter() - self.clock, 3)
            if cpu:
                self.point["cpu_seconds"] = time.process_time() - self.cpu_clock
            self.points.append(dict(self.point))

    return CurveLogger()


class SB3Actor:
    """An SB3 policy behind splitrl's evaluation loop; stacks frames as VecFrameStack does (zeros first)."""

    def __init__(self, model: Any, run: RunSettings) -> None:
        self.model, self.run = model, run
        self.version = int(model.num_timesteps // (run.unroll_length * run.chunks_per_update))

    @classmethod
    def load(cls, run_dir: Path, run: RunSettings) -> SB3Actor:
        """The policy an SB3 row saved in RUN_DIR (model_path), on the CPU."""
        return cls(require_sb3().PPO.load(model_path(run_dir), device="cpu"), run)

    def start_episode(self) -> None:
        size = self.run.frame_size
        self.stack = np.zeros((1, size, size, self.run.frame_stack), dtype=np.uint8)

    def _push(self, frame: np.ndarray) -> np.ndarray:
        self.stack = np.roll(self.stack, -1, axis=-1)
        self.stack[0, :, :, -1] = frame
        return self.stack

    def act(self, frame: np.ndarray, deterministic: bool) -> Any:
        action, _ = self.model.predict(self._push(frame), deterministic=deterministic)
        return int(action[0]) if np.ndim(action[0]) == 0 else action[0]

    @torch.no_grad()
    def probabilities(self, frame: np.ndarray) -> np.ndarray:
        """A discrete policy's action probabilities for the stack ending in `frame` (stacks it, as act does)."""
        observation, _ = self.model.policy.obs_to_tensor(self._push(frame))
        return self.model.policy.get_distribution(observation).distribution.probs[0].numpy().copy()


def _same(actor: SB3Actor, _: ActionSpec) -> SB3Actor:
    return actor


def train_sb3(run_dir: Path, run: RunSettings, budget: Budget) -> None:
    """Bring the SB3 row to `budget.total_steps` agent steps in segments, each saved and evaluated (resumable)."""
    sb3 = require_sb3()
    torch.set_num_threads(run.torch_threads)
    run_dir.mkdir(parents=True, exist_ok=True)
    run_dir_files.save_settings(run_dir, run.model_copy(update={"run_dir": run_dir}).model_dump_json(indent=2))
    saved = model_path(run_dir)

    def evaluate(episodes: int, deterministic: bool) -> None:
        actor = SB3Actor.load(run_dir, run)
        settings = EvalSettings.model_validate({"episodes": episodes, "deterministic": deterministic})
        evaluate_actor(run_dir, run, partial(_same, actor), settings)

    def train_to(offset: dict[str, float], target: int) -> None:
        done = int(offset["env_steps"])
        venv = _vector_env(run, run.seed + done)  # a resumed run plays tracks it has not played yet
        model = sb3.PPO.load(saved, env=venv, device="cpu") if saved.exists() else None
        model = _with_schedule(model or _new_model(run, venv, run.seed))
        model.ent_coef = run.entropy_coef  # the recipe's, not what a loaded model pickled (an anneal lowers it)
        print(f"  {ROW} seed {run.seed}: training to {target * run.action_repeat:,} frames", flush=True)
        curve_logger = _curve_callback(offset, every_steps=run.unroll_length * run.chunks_per_update)
        model.learn(target - done, callback=_callbacks(run, curve_logger), reset_num_timesteps=False)
        saved.parent.mkdir(parents=True, exist_ok=True)
        model.save(saved)
        for point in curve_logger.points:  # after the save, so a run killed mid-segment resumes consistently
            run_dir_files.append_curve(run_dir, point)
        venv.close()

    run_segments(run_dir, budget, evaluate, train_to)


def measure_sb3(run: RunSettings, warmup_fraction: float) -> BaselineResult:
    """SB3 PPO trained for `run.steps` agent steps from scratch, timed as the bench times splitrl: agent steps
    and updates per second after the warm-up, and the wall time to `run.steps` with set-up (envs, model); its
    CPU time after the warm-up where every env steps in this process (DummyVecEnv: not with env workers)."""
    require_sb3()
    torch.set_num_threads(run.torch_threads)
    started = time.perf_counter()
    venv = _vector_env(run, run.seed)
    try:
        model = _with_schedule(_new_model(run, venv, run.seed))
        curve_logger = _curve_callback(dict(ZERO_POINT), every_steps=run.num_envs, cpu=True)
        model.learn(run.steps, callback=_callbacks(run, curve_logger))
    finally:
        venv.close()
    points = [(0.0, 0.0, 0.0, 0.0)]
    points += [(p["env_steps"], p["seconds"], p["updates"], p["cpu_seconds"]) for p in curve_logger.points]
    first, last = steady_span(points, warmup_fraction)
    paced_updates, paced_seconds = update_pace(points, first, last)
    return BaselineResult(
        steps=int(last[0] - first[0]),
        seconds=last[1] - first[1],
        env_us_per_step=None,
        model_us_per_step=None,
        update_us_per_step=None,
        updates=int(last[2] - first[2]),
        wall_seconds=time.perf_counter() - started,
        total_steps=int(last[0]),
        cpu_seconds=None if run.env_workers else last[3] - first[3],
        paced_updates=paced_updates,
        paced_seconds=paced_seconds,
    )

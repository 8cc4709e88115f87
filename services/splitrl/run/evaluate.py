"""`splitrl eval RUN_DIR`: the trained agent plays episodes training never saw, and can be filmed doing it.

The agent is rebuilt from the run's checkpoints exactly as the stack runs it:
cloud mode's whole network (learner.pt), or the edge's encoder (edge-encoder/
encoder.pt) feeding the learner's head. Observations cross the same codecs
they crossed in training: an H.264 cloud run sees decoded video frames, a
split run's head sees activations after the activation codec's round trip.

Episode k is reset with seed EVAL_SEED_BASE + seed + k. Training seeds its envs
with the run's seed plus env index plus steps already taken, far below the
base, and later training episodes draw tracks from those envs' own generators;
so evaluation tracks are ones training did not reset to.
Each evaluation is appended to RUN_DIR/evals.jsonl and drawn on learning.png.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import av
import gymnasium as gym
import numpy as np
import torch

from splitrl.core import checkpoint, precision, wire
from splitrl.core.envs import action_spec_from_space, make_env
from splitrl.core.framestack import FrameStacker
from splitrl.core.models import Encoder, cloud_network
from splitrl.core.spec import ActionSpec
from splitrl.core.video import VideoStreamDecoder, VideoStreamEncoder
from splitrl.run import files as run_dir_files
from splitrl.run.settings import EVAL_SEED_BASE, EvalSettings, RunSettings


class Agent:
    """The trained agent of one run directory: uint8 frames in, one action out per step."""

    def __init__(self, run_dir: Path, run: RunSettings, action_spec: ActionSpec) -> None:
        self.run, self.action_spec = run, action_spec
        model = run.network_config()
        learner = _checkpoint(run_dir_files.learner_checkpoint_dir(run_dir) / "learner.pt")
        self.version = int(learner["version"])
        self.encoder: Encoder | None = None
        self.network = cloud_network(run.mode, model, action_spec)
        if run.mode != "cloud":
            self.encoder = model.encoder()
            edge = _checkpoint(run_dir_files.edge_checkpoint_dir(run_dir) / "encoder.pt")
            self.encoder.load_state_dict(edge["encoder"])
            self.encoder.eval()
        self.network.load_state_dict(learner["network"])
        self.network.eval()

    def start_episode(self) -> None:
        size = self.run.frame_size
        self.stacker = FrameStacker(1, self.run.frame_stack, size, size)
        self.first = True
        if self.run.mode == "cloud" and self.run.codec == "h264":  # a keyframe starts every stream
            self.video_in = VideoStreamEncoder(size, self.run)  # RunSettings is VideoSettings
            self.video_out = VideoStreamDecoder(size, 1)

    @torch.no_grad()
    def act(self, frame: np.ndarray, deterministic: bool) -> Any:
        distribution = self._distribution(frame)
        if self.action_spec.kind == "discrete":
            probs = distribution.probs  # type: ignore[attr-defined]
            action = probs.argmax(-1) if deterministic else torch.multinomial(probs, 1).squeeze(-1)
            return int(action[0])
        base = distribution.base_dist  # type: ignore[attr-defined]
        action = base.loc if deterministic else base.sample()
        return np.clip(action[0].numpy(), self.action_spec.low, self.action_spec.high)

    @torch.no_grad()
    def probabilities(self, frame: np.ndarray) -> np.ndarray:
        """A discrete policy's action probabilities for the stack ending in `frame` (stacks it, as act does)."""
        return self._distribution(frame).probs[0].numpy().copy()  # type: ignore[attr-defined]

    def _distribution(self, frame: np.ndarray) -> torch.distributions.Distribution:
        """The policy's action distribution after pushing `frame` through the run's codecs and frame stack."""
        frames = torch.from_numpy(np.ascontiguousarray(frame))[None]
        if self.run.mode == "cloud" and self.run.codec == "h264":
            frames = self.video_out.decode(self.video_in.encode(frames))
        stacks = self.stacker.push(frames, torch.tensor([self.first]))
        self.first = False
        inputs = stacks
        if self.encoder is not None:
            codec = self.run.activation_codec
            activations = precision.forward_in(self.run.encoder_precision, self.encoder, stacks)  # as the edge acts
            inputs = wire.decode_float(wire.encode_float(activations, codec), expect_shape=[1, None])
        distribution, _ = self.network(inputs)
        return distribution


def _checkpoint(path: Path) -> dict[str, Any]:
    state = checkpoint.load(path)
    if state is None:
        raise ValueError(f"no checkpoint at {path}: has the run trained at least one update?")
    return state


def run_settings(run_dir: Path) -> RunSettings:
    """The settings `splitrl up` ran `run_dir` with (settings.json, or summary.json of older runs)."""
    try:
        saved = run_dir_files.load_settings(run_dir)
    except ValueError:
        summary = run_dir / "summary.json"
        if not summary.exists():
            raise
        saved = json.loads(summary.read_text())["settings"]
    return RunSettings.model_validate(saved)


class Actor(Protocol):
    """What plays an evaluation episode: splitrl's Agent, or a reference peer's policy."""

    version: int  # the policy version (learner updates) being evaluated

    def start_episode(self) -> None: ...

    def act(self, frame: np.ndarray, deterministic: bool) -> Any: ...


def evaluate(run_dir: Path, settings: EvalSettings) -> dict[str, Any]:
    """Play `settings.episodes` episodes with the run's agent; append the result to RUN_DIR/evals.jsonl."""
    run = run_settings(run_dir)
    return evaluate_actor(run_dir, run, lambda spec: Agent(run_dir, run, spec), settings)


def evaluate_actor(
    run_dir: Path, run: RunSettings, make_actor: Callable[[ActionSpec], Actor], settings: EvalSettings
) -> dict[str, Any]:
    """Play `settings.episodes` episodes of `run`'s env with the actor; append the result to RUN_DIR/evals.jsonl
    at the env steps of the run's curve, and return it."""
    torch.set_num_threads(settings.torch_threads)
    env = _make_env(run, film=settings.record is not None)
    actor = make_actor(action_spec_from_space(env.action_space))
    recorder = Recorder(settings.record, run, env) if settings.record is not None else None
    returns, lengths, out_of_time = [], [], 0
    started = time.monotonic()
    try:
        for k in range(settings.episodes):
            filming = recorder is not None and k < settings.record_episodes
            episode_return, length, truncated = play_episode(
                env, actor, EVAL_SEED_BASE + settings.seed + k, settings.deterministic, recorder if filming else None
            )
            returns.append(episode_return)
            lengths.append(length)
            out_of_time += truncated
    finally:
        env.close()
        if recorder is not None:
            recorder.close()
    curve = run_dir_files.load_curve(run_dir)
    threshold = _reward_threshold(run.env)
    result = {
        "env_steps": curve[-1]["env_steps"] if curve else None,
        "policy_version": actor.version,
        "episodes": len(returns),
        "deterministic": settings.deterministic,
        "first_seed": EVAL_SEED_BASE + settings.seed,
        **summarize(returns),
        "mean_length": float(np.mean(lengths)),
        "out_of_time": out_of_time,
        "reward_threshold": threshold,
        "at_threshold": None if threshold is None else sum(r >= threshold for r in returns),
        "wall_seconds": round(time.monotonic() - started, 1),
        "returns": returns,
    }
    run_dir_files.append_eval(run_dir, result)
    return result


def _reward_threshold(env_id: str) -> float | None:
    """The return gymnasium's registry calls solving `env_id` (900 for CarRacing), or None."""
    threshold = gym.spec(env_id).reward_threshold if env_id in gym.registry else None
    return None if threshold is None else float(threshold)


def _make_env(run: RunSettings, film: bool) -> gym.Env[Any, Any]:
    """The run's env; to film, with its RGB render on if it takes a render_mode."""
    if film and "render_mode" not in run.env_kwargs:
        try:
            filmed = {**run.env_kwargs, "render_mode": "rgb_array"}
            return make_env(run.env, filmed, run.frame_size, run.action_repeat)
        except TypeError:  # an env whose constructor has no render_mode
            pass
    return make_env(run.env, run.env_kwargs, run.frame_size, run.action_repeat)


def play_episode(
    env: gym.Env[Any, Any], agent: Actor, seed: int, deterministic: bool, recorder: Recorder | None
) -> tuple[float, int, bool]:
    """(return, agent steps, whether the time limit cut it) of one episode reset with `seed`.

    torch's random numbers are seeded with `seed` too, so a sampling policy draws the same actions on the same
    track every time it is evaluated (two evaluations of one checkpoint differed by 73 points in 20 CarRacing
    episodes before), and runs compared on the same tracks are compared on the same draws."""
    torch.manual_seed(seed)
    frame, _ = env.reset(seed=seed)
    agent.start_episode()
    total, steps, done = 0.0, 0, False
    while not done:
        if recorder is not None:
            recorder.add(env, frame)
        frame, reward, terminated, truncated, _ = env.step(agent.act(frame, deterministic))
        total += float(reward)
        steps += 1
        done = terminated or truncated
    return total, steps, bool(truncated and not terminated)


def summarize(returns: list[float]) -> dict[str, float]:
    """Mean, interquartile mean (the middle 50% of episodes, Agarwal et al. 2021), std, min and max."""
    ordered = np.sort(np.asarray(returns, dtype=np.float64))
    quarter = len(ordered) // 4
    middle = ordered[quarter : len(ordered) - quarter] if len(ordered) >= 4 else ordered
    return {
        "mean": float(ordered.mean()),
        "iqm": float(middle.mean()),
        "std": float(ordered.std()),
        "min": float(ordered[0]),
        "max": float(ordered[-1]),
    }


class Recorder:
    """An H.264 MP4 of what a person would watch: the env's own RGB render if it has one, else the gray frames."""

    def __init__(self, path: Path, run: RunSettings, env: gym.Env[Any, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.container = av.open(str(path), mode="w")
        fps = env.metadata.get("render_fps") or 30
        self.fps = max(1, round(fps / run.action_repeat))  # one picture per agent step
        self.stream: Any = None
        self.frames = 0

    def add(self, env: gym.Env[Any, Any], frame: np.ndarray) -> None:
        picture = _rgb_picture(env, frame)
        if self.stream is None:
            self.stream = self.container.add_stream("libx264", rate=self.fps)
            self.stream.height, self.stream.width = picture.shape[:2]
            self.stream.pix_fmt = "yuv420p"
        for packet in self.stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")):
            self.container.mux(packet)
        self.frames += 1

    def close(self) -> None:
        if self.stream is not None:
            for packet in self.stream.encode():
                self.container.mux(packet)
        self.container.close()


def _rgb_picture(env: gym.Env[Any, Any], frame: np.ndarray) -> np.ndarray:
    """uint8 RGB [H, W, 3] with even sides (H.264 4:2:0): the env's render, or the gray frame scaled up 4x."""
    rendered = env.unwrapped.render() if env.unwrapped.render_mode == "rgb_array" else None
    if isinstance(rendered, np.ndarray):
        picture = rendered
    else:
        gray = np.repeat(np.repeat(frame, 4, axis=0), 4, axis=1)
        picture = np.repeat(gray[:, :, None], 3, axis=2)
    height, width = picture.shape[0] // 2 * 2, picture.shape[1] // 2 * 2
    return np.ascontiguousarray(picture[:height, :width, :3])

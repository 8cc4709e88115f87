"""Learner service: sample chunks from replay, run a PPO update, publish the new weights to inference.

Each update's policy version is one more than the last; inference swaps the
weights in while its streams keep running (in-flight updates), so chunks in
replay can be a few versions old. Their lag is measured, and chunks older
than `max_policy_lag` versions are dropped and counted.

With `world_size` > 1 several learners train one policy as data-parallel ranks (`distributed.py`): each
samples its share of every update, gradients are averaged every minibatch, and rank 0 alone publishes and
checkpoints. In split modes the edges dial rank 0, which relays every rank's encoder traffic (`edge_relay.py`).

Split modes train the actor-critic head here and the CNN encoder on the edge:
edge-encoders dial this service's `EncoderTraining` stream (`edges.py`), and
the trainer exchanges activations and gradients with them (`trainer.py`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path

import grpc
import torch

from splitrl.core import checkpoint, trajectory, weights
from splitrl.core.backoff import Backoff
from splitrl.core.chunk_content import ChunkLimits, stored_observation_shape
from splitrl.core.metrics import Metrics
from splitrl.core.models import ActorCritic, ActorCriticHead
from splitrl.core.rpc import BadRequest
from splitrl.core.service import BackgroundLoop, LoopService
from splitrl.core.trajectory import TrajectoryTensors
from splitrl.learner.batch import Batch
from splitrl.learner.distributed import DataParallel, weights_checksum
from splitrl.learner.edge_relay import EdgeRelay
from splitrl.learner.edges import EdgeLinks
from splitrl.learner.network import learner_network
from splitrl.learner.publisher import WeightsBroadcast
from splitrl.learner.sampler import ReplaySampler, SampledChunk
from splitrl.learner.settings import LearnerSettings
from splitrl.learner.trainer import EdgeTraining, Trainer, UpdateStats
from splitrl.replay.selectors import importance_weights
from splitrl.v1 import training_pb2_grpc

log = logging.getLogger(__name__)


EDGE_WAIT_LOG_S = 10.0


class LearnerService(LoopService):
    """Trains until stopped (or `max_updates`); checkpoints every `checkpoint_every` updates."""

    serves_wan = True  # edges' training links (split modes)

    def __init__(self, settings: LearnerSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        metrics.run.info(
            {"mode": settings.mode, "train_precision": settings.train_precision}
            | ({"codec": settings.gradient_codec} if settings.mode != "cloud" else {})
        )
        self.edges: EdgeLinks | None = None
        if settings.mode != "cloud" and settings.rank == 0:  # edges dial rank 0 only (learner.edge_relay)
            self.edges = EdgeLinks(
                metrics,
                settings.width,
                max_encoder_lag=settings.max_encoder_lag,
                gradient_codec=settings.gradient_codec,
                activation_bound=settings.activation_bound(),
            )
        torch.manual_seed(settings.seed)  # initial weights: inference builds the same from the same seed
        self._network = learner_network(settings)
        head = self._network.head if isinstance(self._network, ActorCritic) else self._network
        assert isinstance(head, ActorCriticHead), type(head)
        #: What a chunk of this run may hold: one that no run makes would crash or poison an update. The action
        #: space, the observations' shape and finiteness: the bounds on magnitudes are replay's to set.
        shape = stored_observation_shape(settings.mode == "cloud", settings.network_config())
        self.limits = ChunkLimits(head.action_spec, shape, max_abs_reward=math.inf, max_abs_value=math.inf)
        #: Built on the training thread once the port is open (`start`), with the checkpoint restored: Adam's
        #: first parameters import torch._dynamo (1.5-3.5 s here), which need not keep a restarted learner
        #: from serving. `run` awaits it before its first update; `ready()` lets others await it.
        self._trainer: Trainer | None = None
        self._built: asyncio.Future[None] | None = None
        self.service_names: Sequence[str] = () if self.edges is None else (EdgeLinks.service_name,)
        self.version = 0
        #: Replay cursor, checkpointed: items this learner has sampled (over restarts) and the newest key.
        self.samples_consumed, self.last_sampled_key = 0, -1
        self._skipped_steps_counted = 0  # of the trainer's skipped_steps, those already in the metric
        self._update: Future[UpdateStats] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="train")
        self.loop = BackgroundLoop("learner loop")
        self.parallel: DataParallel | None = None  # joined on the training thread (`_build_trainer`)
        path = self._checkpoint_path()
        #: Read and verified before the port opens: a checkpoint with no good generation refuses the start here.
        self._saved = None if path is None else checkpoint.load(path)

    @property
    def trainer(self) -> Trainer:
        if self._trainer is None:
            raise RuntimeError("the learner's trainer is still being built: await ready() first")
        return self._trainer

    async def start(self) -> None:
        self._built = asyncio.wrap_future(self._executor.submit(self._build_trainer))
        await super().start()

    async def ready(self) -> None:
        """Returns once the trainer is built and the checkpoint (if any) restored; raises what the build raised."""
        if self._built is None:
            raise RuntimeError("the learner has not been started")
        await asyncio.shield(self._built)

    def _build_trainer(self) -> None:
        """The trainer, with the checkpoint restored into it and, with data-parallel ranks, the group joined and
        rank 0's state taken; `trainer` is set only once all is done."""
        s = self.settings
        try:
            edges: EdgeTraining | None = self.edges
            if s.world_size > 1:
                log.info("rank %d of %d: joining the learners at %s", s.rank, s.world_size, s.rendezvous_endpoint)
                self.parallel = DataParallel(s.rank, s.world_size, s.rendezvous_endpoint, s.rendezvous_timeout_s)
                if s.mode != "cloud":
                    edges = EdgeRelay(self.parallel, self.edges)
            trainer = Trainer(self._network, s, edges, self.parallel)
            self._restore(trainer)
            if self.parallel is not None:
                self.version = self.parallel.sync_state(trainer.network, trainer.optimizer, self.version)
                log.info("rank %d of %d: joined at policy version %d", s.rank, s.world_size, self.version)
        except Exception:
            log.exception("building the trainer failed")  # logged here: stop() may come before run() sees it
            raise
        self._trainer = trainer

    def register(self, server: grpc.aio.Server) -> None:
        if self.edges is not None:
            training_pb2_grpc.add_EncoderTrainingServicer_to_server(self.edges, server)

    async def stop(self) -> None:
        await self.loop.cancel()
        if self.edges is not None:
            self.edges.close()  # an update still running gets no more answers from edges, so it ends soon
        # Off the event loop: the trainer thread may still need the loop to hear that edges are gone.
        # The data-parallel group is left for the process's exit to tear down: after a rank died, destroying it
        # waits on that rank, and a stopping learner must not.
        await asyncio.to_thread(self._executor.shutdown, wait=True)
        interrupted = self._update  # a concurrent future: cancelling the loop did not stop the thread's work
        finished = interrupted is not None and not interrupted.cancelled() and interrupted.exception() is None
        if finished and interrupted is not None and interrupted.result().optimizer_steps > 0:
            self.version += 1  # the interrupted update changed the weights: the checkpoint's version says so
        self._checkpoint()

    async def run(self) -> None:
        """Train until `max_updates` (or until stopped). A lost replay or inference is waited for, never fatal."""
        s = self.settings
        publisher = WeightsBroadcast(
            s.inference_address if s.rank == 0 else "",  # other ranks hold the same weights: rank 0 publishes
            s,
            self.metrics,
            lambda: Backoff.of(s),
            ack_timeout_s=s.publish_timeout_s,
        )
        await self.ready()
        publishing = asyncio.create_task(publisher.run(), name="weights publisher")
        replay = ReplaySampler(s.replay_address, s.replay_table, s, self.metrics, lambda: Backoff.of(s))
        try:
            loop = asyncio.get_running_loop()
            if self.version > 0:  # resumed: inference must act with the restored policy, or every chunk is stale
                publisher.offer(weights.to_proto(self.version, self.trainer.network.state_dict()))
            while not s.max_updates or self.version < s.max_updates:
                chunks, sampled = await self._collect(replay, s.chunks_per_update // s.world_size)
                await self._wait_for_an_edge()
                batch = Batch.stack(chunks, self._importance_weights(sampled))
                self._update = self._executor.submit(partial(self.trainer.update, batch, version=self.version))
                stats = await asyncio.wrap_future(self._update)
                self._update = None
                if stats.optimizer_steps == 0:
                    log.warning("no row of this batch could be trained (edges gone?); the policy is unchanged")
                    continue
                self.version += 1
                self._record(stats)
                if s.priority_updates:  # each chunk's mean |advantage|, computed before the update
                    await replay.update_priorities(sampled, stats.chunk_priorities)
                # Serialized here, between updates, while the trainer thread is idle; delivered in the background.
                publisher.offer(weights.to_proto(self.version, self.trainer.network.state_dict()))
                if self.version % s.checkpoint_every == 0:
                    await loop.run_in_executor(self._executor, self._checkpoint)
            if self.version > 0 and not await publisher.delivered(self.version, s.publish_timeout_s):
                log.warning("inference did not acknowledge version %d before the learner finished", self.version)
        finally:
            publishing.cancel()
            await asyncio.gather(publishing, return_exceptions=True)
            await replay.close()

    async def _collect(self, replay: ReplaySampler, count: int) -> tuple[list[TrajectoryTensors], list[SampledChunk]]:
        """Sample until `count` fresh-enough chunks are in hand (this rank's share of an update); also return
        what replay said of each."""
        s = self.settings
        chunks: list[TrajectoryTensors] = []
        sampled: list[SampledChunk] = []
        while len(chunks) < count:
            for item, drawn in await replay.sample(count - len(chunks)):
                self.samples_consumed += 1
                self.last_sampled_key = item.key
                try:  # replay checks this too, where it was started with the run's spec (core.chunk_content)
                    self.limits.check(item.trajectory)
                except BadRequest as error:
                    self.metrics.refused_chunks.inc()
                    log.error("sampled chunk %d refused: %s", item.key, error)
                    continue
                chunk = trajectory.from_proto(item.trajectory)
                lag = self.version - int(chunk.policy_versions.min())
                self.metrics.policy_lag.observe(lag)
                if lag > s.max_policy_lag:
                    self.metrics.stale_chunks_dropped.inc()
                    continue
                chunks.append(chunk)
                sampled.append(drawn)
        return chunks, sampled

    def _importance_weights(self, sampled: list[SampledChunk]) -> torch.Tensor:
        if self.settings.importance_beta == 0:
            return torch.ones(len(sampled))
        return importance_weights(
            [c.probability for c in sampled], [c.table_size for c in sampled], self.settings.importance_beta
        )

    async def _wait_for_an_edge(self) -> None:
        """Split modes: the encoder trains on the edges, so an update waits until one is connected to rank 0.

        With data-parallel ranks the wait is a group step: every EDGE_WAIT_LOG_S at most, rank 0 tells the
        others whether an edge is here, so no rank sits in a collective past `rendezvous_timeout_s` while rank 0
        waits for edges."""
        if self.settings.mode == "cloud":
            return
        connected = False
        while not connected:
            if self.edges is not None and self.edges.edge_count == 0:
                try:
                    await asyncio.wait_for(self.edges.connected.wait(), EDGE_WAIT_LOG_S)
                except TimeoutError:
                    log.info("waiting for an edge-encoder to dial in before training")
            connected = self.edges is None or self.edges.edge_count > 0  # only rank 0 holds edges: it decides
            if self.parallel is not None:
                loop = asyncio.get_running_loop()
                connected = await loop.run_in_executor(self._executor, self.parallel.rank_0_says, connected)

    def _record(self, stats: UpdateStats) -> None:
        checksum = ""
        if self.parallel is not None:
            summed = weights_checksum(self.trainer.network)
            self.metrics.learner_weights_checksum.set(summed)
            # Logged too: ranks compare version by version there, which two scrapes cannot promise.
            checksum = f", weights checksum {summed!r}"
        self.metrics.policy_version.set(self.version)
        skipped = self.trainer.skipped_steps - self._skipped_steps_counted
        self.metrics.learner_skipped_steps.inc(skipped)
        self._skipped_steps_counted += skipped
        self.metrics.learning_rate.set(stats.learning_rate)
        self.metrics.entropy_coef.set(stats.entropy_coef)
        for term, value in stats.losses.items():
            self.metrics.learner_loss.labels(term=term).set(value)
        # Counted last: a scrape that sees this update counted sees its gauges (TensorBoard charts them then).
        if self.settings.rank == 0:  # one update of the group, however many ranks took part
            self.metrics.learner_last_update.set_to_current_time()
            self.metrics.learner_updates.inc()
        losses = stats.losses
        log.info(
            "update %d: %d steps, lr %.3g, entropy coef %.3g, policy %.3f value %.3f entropy %.3f kl %.4f%s",
            self.version,
            stats.steps,
            stats.learning_rate,
            stats.entropy_coef,
            losses.policy_loss,
            losses.value_loss,
            losses.entropy,
            losses.approx_kl,
            checksum,
        )

    def _checkpoint_path(self) -> Path | None:
        return None if self.settings.checkpoint_dir is None else self.settings.checkpoint_dir / "learner.pt"

    def _checkpoint(self) -> None:
        """Model, optimizer, policy version, replay cursor and RNG states, atomically (core.checkpoint)."""
        path = self._checkpoint_path()
        if path is None or self.version == 0 or self._trainer is None or self.settings.rank != 0:
            return
        network = self.trainer.network.state_dict()
        broken = [name for name, value in network.items() if value.is_floating_point() and not value.isfinite().all()]
        if broken:  # never on disk: a restart would resume from it, and every restart after that
            log.error(
                "checkpoint not written: weights %s hold NaN or Inf; %s keeps the last good one", broken[:3], path
            )
            return
        state = {
            "version": self.version,
            "network": network,
            "optimizer": self.trainer.optimizer.state_dict(),
            "replay": {
                "table": self.settings.replay_table,
                "samples_consumed": self.samples_consumed,
                "last_sampled_key": self.last_sampled_key,
            },
            "rng": checkpoint.rng_state(self.trainer.generator),
        }
        checkpoint.save(state, path)

    def _restore(self, trainer: Trainer) -> None:
        state, self._saved = self._saved, None
        if state is None:
            return
        trainer.network.load_state_dict(state["network"])
        trainer.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.metrics.policy_version.set(self.version)
        if "replay" in state:  # checkpoints from before the cursor and RNG were kept have neither
            self.samples_consumed = int(state["replay"]["samples_consumed"])
            self.last_sampled_key = int(state["replay"]["last_sampled_key"])
            checkpoint.restore_rng(state["rng"], trainer.generator)
        log.info(
            "resumed from %s at version %d (%d items sampled so far, newest key %d)",
            self._checkpoint_path(),
            self.version,
            self.samples_consumed,
            self.last_sampled_key,
        )

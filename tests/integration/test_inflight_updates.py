"""In-flight weight updates: the learner publishes, inference swaps weights while edge streams stay open."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import grpc
import pytest
import torch

from splitrl.core import rpc, scrape, weights
from splitrl.learner.service import LearnerService
from splitrl.learner.settings import LearnerSettings
from splitrl.v1 import weights_pb2_grpc
from tests.integration.stack import FAST_ENV, Stack, address, start

LEARNER = {"chunks_per_update": 4, "epochs": 1, "minibatches": 2, "max_policy_lag": 50}


async def test_policy_version_advances_while_streams_stay_open():
    stack = await Stack.start("split", num_envs=2, steps=0, unroll_length=8, learner=LEARNER)
    try:
        inference = stack.inference
        versions_seen = set()
        for _ in range(600):  # bounded: at most ~60 s
            await asyncio.sleep(0.1)
            versions_seen.add(inference.policy.version)
            if inference.policy.version >= 3:
                break
        assert inference.policy.version >= 3, "inference never received three updates"
        assert len(versions_seen) >= 2
        assert inference.policy.acting_in == "onnxruntime"  # the default runtime, once its session was swapped in
        for _ in range(50):  # the gauge is set once the swap's executor call returns to the event loop
            texts = stack.scrape()
            if scrape.total([texts["inference"]], "splitrl_policy_version") >= 3:
                break
            await asyncio.sleep(0.1)
        # One edge stream served every version: the environment's only stream never broke.
        assert not stack.environment.finished().is_set() and stack.environment.failure() is None
        open_act = [
            v
            for n, labels, v in scrape.samples(texts["inference"])
            if n == "splitrl_streams_open" and labels["method"] == "Act"
        ]
        assert open_act == [1.0]
        assert scrape.total([texts["inference"]], "splitrl_policy_version") >= 3
        assert scrape.total([texts["learner"]], "splitrl_policy_lag_count") >= 3 * LEARNER["chunks_per_update"]
        link = scrape.link_counts([texts["learner"], texts["inference"]])["learner-inference"]["weights"]
        assert link["weights"]["received"]["messages"] >= 3
        assert link["weights"]["sent"]["bytes"] >= link["weights"]["received"]["bytes"] > 0
    finally:
        await stack.stop()


async def test_inference_refuses_bad_weights_and_keeps_its_version():
    stack = await Stack.start("split", num_envs=1, steps=0)
    try:
        inference = stack.inference
        good = inference.policy.network.state_dict()
        async with rpc.insecure_channel(address(stack.hosts["inference"])) as channel:
            stub = weights_pb2_grpc.PolicyUpdatesStub(channel)

            async def publish(message):
                call = stub.Publish()
                await call.write(message)
                return await call.read()

            cases = {
                "missing": weights.to_proto(1, dict(list(good.items())[:-1])),
                "unknown entry": weights.to_proto(1, {**good, "extra.weight": torch.zeros(1)}),
                "does not match": weights.to_proto(1, {**good, "critic.bias": torch.zeros(3)}),
                "NaN": weights.to_proto(1, {**good, "critic.bias": torch.full((1,), float("nan"))}),
                # finite, and far beyond anything Adam's steps reach (--max-weight-magnitude)
                "above the bound": weights.to_proto(1, {**good, "critic.bias": torch.full((1,), 1e30)}),
                # a version no learner reaches: taken, it would make every real update look older
                "beyond any run": weights.to_proto(2**64 - 1, good),
            }
            for fragment, message in cases.items():
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await publish(message)
                assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert fragment in raised.value.details(), raised.value.details()
            assert inference.policy.version == 0
            changed = {name: value + 1.0 for name, value in good.items()}
            ack = await publish(weights.to_proto(7, changed))
            assert ack.version == 7 and inference.policy.version == 7
            assert torch.equal(inference.policy.network.state_dict()["critic.bias"], changed["critic.bias"])
            assert (await publish(weights.to_proto(7, changed))).version == 7  # a resumed learner re-publishes
            # On one stream versions only move forward, by plausible steps (--max-version-step)...
            call = stub.Publish()
            for version, refused in ((8, None), (7, "does not follow 8"), (9 + 1000, "does not follow 8")):
                await call.write(weights.to_proto(version, changed))
                if refused is None:
                    assert (await call.read()).version == version
                    continue
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await call.read()
                assert refused in raised.value.details()
                call = stub.Publish()  # a refusal ends the stream; the learner's publisher dials again
                await call.write(weights.to_proto(8, changed))
                assert (await call.read()).version == 8
            assert inference.policy.version == 8
            # ...while a stream's first version may go back: a learner resumed from an older checkpoint.
            assert (await publish(weights.to_proto(6, good))).version == 6
            assert inference.policy.version == 6
    finally:
        await stack.stop()


async def test_weights_whose_forward_pass_overflows_are_refused_before_acting():
    """Finite weights under the bound can still overflow float32 through the layers: inference tries them on
    probe observations first, and keeps acting with what it had."""
    stack = await Stack.start("split", num_envs=1, steps=0, inference={"max_weight_magnitude": 1e38})
    try:
        inference = stack.inference
        good = inference.policy.network.state_dict()
        huge = {name: torch.full_like(value, 1e20) for name, value in good.items()}
        async with rpc.insecure_channel(address(stack.hosts["inference"])) as channel:
            call = weights_pb2_grpc.PolicyUpdatesStub(channel).Publish()
            await call.write(weights.to_proto(1, huge))
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call.read()
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "probe observations" in raised.value.details()
        assert inference.policy.version == 0
        decisions = inference.policy.act(torch.zeros(2, inference.model_config.width, dtype=torch.bfloat16))
        assert bool(torch.isfinite(decisions.values).all())
    finally:
        await stack.stop()


async def test_edge_streams_are_answered_while_inference_decodes_new_weights(monkeypatch):
    """Weights are metered, decoded and checked off the event loop: CarRacing's took 12-23 ms an update, which
    on the loop held every Act stream's answer. Here decoding is held until three more answers went out; on
    the loop it would hold the loop (this test's coroutine too) until its bounded wait ran out."""
    decoding, release, decoded = threading.Event(), threading.Event(), threading.Event()
    decode = weights.from_proto

    def held_decode(message, reference, **checks):
        decoding.set()
        release.wait(timeout=60)  # bounded, and past the answers' 30 s: on the loop it holds this test's coroutine
        decoded.set()
        return decode(message, reference, **checks)

    monkeypatch.setattr(weights, "from_proto", held_decode)
    stack = await Stack.start("split", num_envs=1, steps=0)
    try:
        inference = stack.inference

        def answered() -> int:
            links = scrape.link_counts([stack.scrape()["inference"]])
            if "encoder-inference" not in links:
                return 0
            return links["encoder-inference"]["rollout"]["action"]["sent"]["messages"]

        async def until(condition: Callable[[], bool]) -> None:
            for _ in range(300):  # bounded: at most ~30 s
                if condition():
                    return
                await asyncio.sleep(0.1)

        await until(lambda: answered() >= 1)
        assert answered() >= 1, "the edge's stream never began"
        async with rpc.insecure_channel(address(stack.hosts["inference"])) as channel:
            call = weights_pb2_grpc.PolicyUpdatesStub(channel).Publish()
            changed = {name: value + 1.0 for name, value in inference.policy.network.state_dict().items()}
            await call.write(weights.to_proto(5, changed))
            await until(decoding.is_set)
            assert decoding.is_set(), "inference never began decoding the weights"
            before = answered()
            await until(lambda: answered() >= before + 3)
            answered_meanwhile = answered() - before
            assert not decoded.is_set(), "the event loop waited for the weights' decoding"
            release.set()
            assert answered_meanwhile >= 3
            assert (await call.read()).version == 5
            assert inference.policy.version == 5
    finally:
        release.set()
        await stack.stop()


async def test_learner_checkpoints_and_resumes(tmp_path):
    learner_settings = {**LEARNER, "checkpoint_dir": tmp_path, "checkpoint_every": 1, "max_updates": 2}
    stack = await Stack.start("split", num_envs=2, steps=0, unroll_length=8, learner=learner_settings)
    try:
        learner = stack.hosts["learner"].service
        await asyncio.wait_for(learner.finished().wait(), 120)
        assert learner.failure() is None and learner.version == 2
        assert (tmp_path / "learner.pt").exists()
        resumed = await start(
            LearnerService,
            LearnerSettings(
                tls="plaintext",
                env=FAST_ENV,
                mode="split",
                checkpoint_dir=tmp_path,
                max_updates=2,
                replay_address=address(stack.hosts["replay"]),
                inference_address=address(stack.hosts["inference"]),
            ),
        )
        await resumed.service.ready()
        assert resumed.service.version == 2
        for name, value in resumed.service.trainer.network.state_dict().items():
            assert torch.equal(value, learner.trainer.network.state_dict()[name]), name
        # Having reached max_updates already, the resumed learner only re-publishes its weights, and succeeds.
        await asyncio.wait_for(resumed.service.finished().wait(), 30)
        assert resumed.service.failure() is None
        assert stack.inference.policy.version == 2
        await resumed.stop()
    finally:
        await stack.stop()

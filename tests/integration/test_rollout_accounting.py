"""The rollout path end to end in one process: counters agree on both ends and match the codec."""

from __future__ import annotations

import math

import pytest

from splitrl.core import scrape
from splitrl.core.config import Mode, ObservationCodec
from splitrl.core.metrics import VIDEO_SHADOW_BYTES
from splitrl.run.summary import cloud_h264_shadow
from tests.integration.stack import Stack

NUM_ENVS = 2
STEPS = 320  # agent steps: 160 vector steps of 2 envs
FRAME = 96 * 96
#: Protobuf framing around the observations tensor plus rewards, flags and step ids, per message.
MAX_OVERHEAD_BYTES = 64


@pytest.fixture(
    params=[
        ("split", "frame"),
        ("split-accumulate", "frame"),
        ("cloud", "frame"),
        ("cloud", "frame+zstd"),
        ("cloud", "h264"),
        ("cloud", "stack-bf16"),
    ],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
async def finished_run(request):
    mode, codec = request.param
    stack = await Stack.start(mode, codec, num_envs=NUM_ENVS, steps=STEPS)
    try:
        await stack.wait_done()
        yield mode, codec, stack.scrape()
    finally:
        await stack.stop()


def test_every_link_counts_the_same_on_both_ends(finished_run):
    _, _, texts = finished_run
    links = scrape.link_counts(texts.values())
    assert {"env-encoder", "encoder-inference", "inference-replay"} <= links.keys()
    for link, phases in links.items():
        for phase, payloads in phases.items():
            for payload, ends in payloads.items():
                assert ends.get("sent") == ends.get("received"), f"{link}/{phase}/{payload}: {ends}"
                assert ends["sent"]["messages"] > 0


def test_wan_bytes_per_step_match_the_codec(finished_run):
    mode, codec, texts = finished_run
    links = scrape.link_counts(texts.values())
    uplink = links["encoder-inference"]["rollout"]
    payload, per_env_bytes, per_env_elements = (
        {
            "frame": ("observation", FRAME, FRAME),
            "frame+zstd": ("observation", FRAME, FRAME),
            "h264": ("observation", FRAME, FRAME),
            "stack-bf16": ("observation", 4 * FRAME * 2, 4 * FRAME),
        }[codec]
        if mode == "cloud"
        else ("activation", 4096 * 2, 4096)
    )
    sent = uplink[payload]["sent"]
    vector_steps = STEPS // NUM_ENVS
    assert sent["messages"] == vector_steps
    assert sent["elements"] == vector_steps * NUM_ENVS * per_env_elements
    if codec in ("frame+zstd", "h264") and mode == "cloud":
        # The fast env's frames are mostly background: zstd packs a 2-env message into a small fraction.
        assert sent["bytes"] / vector_steps < NUM_ENVS * per_env_bytes / 10, sent
    else:
        overhead = sent["bytes"] / vector_steps - NUM_ENVS * per_env_bytes
        assert 0 < overhead <= MAX_OVERHEAD_BYTES, f"{overhead} bytes of overhead per message"
    assert set(uplink) == {payload, "action"}, "nothing else crosses the WAN during rollout"
    actions = uplink["action"]["sent"]
    assert actions["messages"] == vector_steps and actions["elements"] == vector_steps * NUM_ENVS


def test_video_is_smaller_than_zstd_and_its_quality_is_exported(finished_run):
    _, codec, texts = finished_run
    if codec != "h264":
        pytest.skip("video rows only")
    sent = scrape.link_counts(texts.values())["encoder-inference"]["rollout"]["observation"]["sent"]
    vector_steps = STEPS // NUM_ENVS
    # Catch at 96 x 96 is a few moving blocks: zstd packs a frame into ~100 B, H.264 at crf 23 into ~27 B
    # (measured over 400 random-play frames); per message, protobuf adds a few bytes per env.
    assert sent["bytes"] / vector_steps < NUM_ENVS * 60, sent
    psnr_count = scrape.total([texts["edge-encoder"]], "splitrl_video_psnr_db_count")
    psnr_sum = scrape.total([texts["edge-encoder"]], "splitrl_video_psnr_db_sum")
    assert psnr_count == vector_steps
    assert psnr_sum / psnr_count >= 35.0, f"mean PSNR {psnr_sum / psnr_count:.1f} dB"
    assert scrape.total([texts["inference"]], "splitrl_video_decode_errors_total") == 0


def test_env_steps_trajectories_and_replay_agree(finished_run):
    _, _, texts = finished_run
    assert scrape.total([texts["environment"]], "splitrl_env_steps_total") == STEPS
    chunks = scrape.total([texts["inference"]], "splitrl_trajectories_total")
    # Each env's chunk of 16 steps is cut once its 17th observation is acted on.
    assert chunks == NUM_ENVS * math.floor((STEPS // NUM_ENVS - 1) / 16)
    assert scrape.total([texts["replay"]], "splitrl_replay_inserts_total") == chunks
    trajectory = scrape.link_counts([texts["replay"]])["inference-replay"]["rollout"]["trajectory"]["received"]
    assert trajectory["messages"] == chunks
    assert scrape.total([texts["environment"]], "splitrl_episode_return_count") > 0
    assert scrape.total([texts["inference"]], "splitrl_inference_batch_size_count") == STEPS // NUM_ENVS


def test_cloud_chunks_carry_each_frame_once(finished_run):
    """Cloud mode's chunks go to replay as the frames their stacks are made of (core.trajectory.unique_frames):
    per chunk of 16 steps, the first stack's 4 frames, one per step, and 3 more at each episode start (Catch's
    last 11 steps), ~1.5 frames per step; whole stacks of 4 would be 4.25."""
    mode, _, texts = finished_run
    trajectory = scrape.link_counts([texts["replay"]])["inference-replay"]["rollout"]["trajectory"]["received"]
    bytes_per_step = trajectory["bytes"] / (trajectory["messages"] * 16)
    if mode == "cloud":
        assert 1.0 < bytes_per_step / FRAME < 2.0, f"{bytes_per_step / FRAME:.2f} frames per step"
    else:  # bf16 activations at the stack's width of 4,096: 8,192 bytes per step, and the bootstrap row's
        assert bytes_per_step < 1.1 * 2 * 4096, f"{bytes_per_step:.0f} bytes per step"


async def scraped_run(mode: Mode, codec: ObservationCodec, edge: dict | None = None) -> dict[str, str]:
    stack = await Stack.start(mode, codec, num_envs=NUM_ENVS, steps=STEPS, edge=edge)
    try:
        await stack.wait_done()
        return stack.scrape()
    finally:
        await stack.stop()


async def test_the_video_shadow_counts_cloud_h264s_bytes_and_sends_nothing():
    """A split run with --video-shadow counts, per ActRequest, what cloud mode over H.264 would have sent for its
    frames, close to what a cloud h264 run of the same env sends, and nothing more crosses the WAN."""
    split = await scraped_run("split", "frame", edge={"video_shadow": True})
    cloud = await scraped_run("cloud", "h264")
    split_links, cloud_links = scrape.link_counts(split.values()), scrape.link_counts(cloud.values())
    assert set(split_links["encoder-inference"]["rollout"]) == {"activation", "action"}
    shadow_requests = scrape.total([split["edge-encoder"]], f"{VIDEO_SHADOW_BYTES}_total")
    cloud_requests = cloud_links["encoder-inference"]["rollout"]["observation"]["sent"]["bytes"]
    # Different drivers (the split's own policy, cloud's), the same kind of frames: within a factor of 2.
    assert 0.5 < shadow_requests / cloud_requests < 2.0, (shadow_requests, cloud_requests)
    assert scrape.total([cloud["edge-encoder"]], f"{VIDEO_SHADOW_BYTES}_total") == 0
    shadow = cloud_h264_shadow(list(split.values()), split_links, STEPS)
    assert shadow is not None
    actions = split_links["encoder-inference"]["rollout"]["action"]["sent"]["bytes"]
    assert shadow["wan_bytes"] == shadow_requests + actions
    split_wan = sum(scrape.wan_by_phase(split_links).values())
    assert shadow["split_share"] == pytest.approx(split_wan / shadow["wan_bytes"])
    assert shadow["split_share"] > 10  # bf16 activations of width 4096 against a few H.264 bytes per frame
    assert cloud_h264_shadow(list(cloud.values()), cloud_links, STEPS) is None

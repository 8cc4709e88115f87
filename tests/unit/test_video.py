"""splitrl.core.video: H.264 round trips with PSNR bounds, per-env and per-stream state, keyframes, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from splitrl.core import video, wire
from splitrl.core.config import VideoSettings

SIZE = 96
MAX_ROWS = 8


def driving_frames(count: int, envs: int = 1, seed: int = 0) -> list[torch.Tensor]:
    """Frames like a top-down track: a textured background scrolling a pixel per frame, with a car-like block;
    every env's scene differs (its own texture and scroll direction)."""
    rng = np.random.default_rng(seed)
    textures = [rng.integers(60, 200, (2 * SIZE, 2 * SIZE), dtype=np.uint8) for _ in range(envs)]
    smooth = [np.cumsum(np.cumsum(t.astype(np.int32), 0), 1) for t in textures]  # integral image: box blur
    blurred = [((s[8:, 8:] - s[:-8, 8:] - s[8:, :-8] + s[:-8, :-8]) // 64).astype(np.uint8) for s in smooth]
    frames = []
    for step in range(count):
        batch = np.stack(
            [b[step * (1 + e) % SIZE :][:SIZE, step % SIZE :][:SIZE, :SIZE].copy() for e, b in enumerate(blurred)]
        )
        batch[:, 60:70, 44:52] = 255
        frames.append(torch.from_numpy(batch))
    return frames


def test_lossless_crf0_gives_every_frame_back_bit_for_bit():
    encoder = video.VideoStreamEncoder(SIZE, VideoSettings(video_crf=0))
    decoder = video.VideoStreamDecoder(SIZE, MAX_ROWS)
    for frames in driving_frames(20, envs=2):
        message = encoder.encode(frames)
        assert encoder.mirror_psnr(frames, message) == video.LOSSLESS_PSNR_DB
        assert torch.equal(decoder.decode(message), frames)


@pytest.mark.parametrize(("crf", "min_psnr_db"), [(18, 40.0), (23, 36.0), (28, 32.0)])
def test_lossy_round_trip_stays_above_its_psnr_bound_and_bytes_fall_with_crf(crf, min_psnr_db):
    encoder = video.VideoStreamEncoder(SIZE, VideoSettings(video_crf=crf))
    decoder = video.VideoStreamDecoder(SIZE, MAX_ROWS)
    sizes, measured = [], []
    for frames in driving_frames(40):
        message = encoder.encode(frames)
        psnr = encoder.mirror_psnr(frames, message)
        decoded = decoder.decode(message)
        # The edge's mirror decode reports exactly what inference sees.
        assert psnr == pytest.approx(video.psnr_db(frames[0].numpy(), decoded[0].numpy()))
        sizes.append(len(message.data))
        measured.append(psnr)
    assert float(np.mean(measured)) >= min_psnr_db
    assert np.mean(sizes[1:]) < SIZE * SIZE / 4  # far below a raw frame once past the keyframe


def test_every_frame_in_gives_one_packet_out_and_one_frame_back():
    encoder = video.FrameEncoder(SIZE, VideoSettings())
    decoder = video.FrameDecoder(SIZE)
    for frames in driving_frames(10):
        packet = encoder.encode(frames[0].numpy())  # raises unless exactly one packet came out
        assert decoder.decode(packet).shape == (SIZE, SIZE)


def test_each_env_has_its_own_encoder_and_decoder():
    """Two envs with different scenes in one stream: each row decodes to its own env's frame."""
    encoder = video.VideoStreamEncoder(SIZE, VideoSettings(video_crf=0))
    decoder = video.VideoStreamDecoder(SIZE, MAX_ROWS)
    for frames in driving_frames(8, envs=3):
        decoded = decoder.decode(encoder.encode(frames))
        assert torch.equal(decoded, frames)
    with pytest.raises(ValueError, match="has 3 envs"):
        encoder.encode(frames[:2])
    with pytest.raises(wire.WireError, match="does not match expected"):
        decoder.decode(encoder.encode(frames), expect_shape=[2, SIZE, SIZE])


def test_two_streams_never_share_decoder_state():
    """Interleaved streams of different scenes, each into its own decoder, both decode exactly."""
    streams = [driving_frames(10, seed=seed) for seed in (1, 2)]
    encoders = [video.VideoStreamEncoder(SIZE, VideoSettings(video_crf=0)) for _ in streams]
    decoders = [video.VideoStreamDecoder(SIZE, MAX_ROWS) for _ in streams]
    for step in range(10):
        for frames, encoder, decoder in zip(streams, encoders, decoders, strict=True):
            assert torch.equal(decoder.decode(encoder.encode(frames[step])), frames[step])


def test_a_stream_decodes_from_its_first_message_and_not_from_the_middle():
    """What a reconnect relies on: a fresh encoder starts with a keyframe, so a fresh decoder decodes its first
    message; a decoder that missed a stream's start refuses what follows instead of inventing frames."""
    frames = driving_frames(6)
    old = video.VideoStreamEncoder(SIZE, VideoSettings())
    for step in range(5):
        old.encode(frames[step])
    with pytest.raises(wire.WireError, match=r"does not decode|decoded to 0 frames"):
        video.VideoStreamDecoder(SIZE, MAX_ROWS).decode(old.encode(frames[5]))
    reopened = video.VideoStreamEncoder(SIZE, VideoSettings(video_crf=0))
    assert torch.equal(video.VideoStreamDecoder(SIZE, MAX_ROWS).decode(reopened.encode(frames[5])), frames[5])


def test_malformed_truncated_foreign_and_oversize_packets_are_refused():
    encoder = video.VideoStreamEncoder(SIZE, VideoSettings())
    good = encoder.encode(driving_frames(1)[0])
    packet = wire.video_packets(good)[0]
    cases = {
        "garbage": (wire.encode_packets([b"\x00\x00\x01garbage"], (1, SIZE, SIZE)), "does not decode|decoded to 0"),
        "truncated": (wire.encode_packets([packet[: len(packet) // 3]], (1, SIZE, SIZE)), "does not decode|decoded"),
        "other size": (
            video.VideoStreamEncoder(48, VideoSettings()).encode(torch.zeros(1, 48, 48, dtype=torch.uint8)),
            "does not match expected",
        ),
    }
    oversize = wire.encode_packets([packet], (1, SIZE, SIZE))
    oversize.packet_sizes[0] = 2 * SIZE * SIZE + 1025
    cases["oversize"] = (oversize, "packet sizes must be in")
    sizes_off = wire.encode_packets([packet], (1, SIZE, SIZE))
    sizes_off.packet_sizes[0] -= 1
    cases["sizes off"] = (sizes_off, "add up to")
    for name, (message, error) in cases.items():
        with pytest.raises(wire.WireError, match=error):
            video.VideoStreamDecoder(SIZE, MAX_ROWS).decode(message)
        assert name


def test_a_picture_larger_than_the_stream_is_refused_before_it_is_decoded():
    """FFmpeg's max_pixels stops a forged keyframe of a huge picture from allocating its frame."""
    big = video.VideoStreamEncoder(1024, VideoSettings()).encode(torch.zeros(1, 1024, 1024, dtype=torch.uint8))
    message = wire.encode_packets(wire.video_packets(big), (1, SIZE, SIZE))  # small enough to pass the size bound
    with pytest.raises(video.VideoDecodeError, match="does not decode"):
        video.VideoStreamDecoder(SIZE, MAX_ROWS).decode(message)


def test_a_stream_holds_at_most_max_rows_decoders():
    frames = torch.zeros(MAX_ROWS + 1, SIZE, SIZE, dtype=torch.uint8)
    message = video.VideoStreamEncoder(SIZE, VideoSettings()).encode(frames)
    with pytest.raises(wire.WireError, match="at most 8"):
        video.VideoStreamDecoder(SIZE, MAX_ROWS).decode(message)
    with pytest.raises(ValueError, match="max_rows must be >= 1"):
        video.VideoStreamDecoder(SIZE, 0)


def test_plain_decode_refuses_video_and_video_needs_uint8_frames():
    message = video.VideoStreamEncoder(SIZE, VideoSettings()).encode(driving_frames(1)[0])
    with pytest.raises(wire.WireError, match="only in its stream's video decoder"):
        wire.decode(message)
    message.dtype = wire.DTYPE_INT8
    with pytest.raises(wire.WireError, match="expected DTYPE_UINT8"):
        wire.video_packets(message)
    with pytest.raises(wire.WireError, match="must be uint8"):
        wire.validate(message)
    with pytest.raises(wire.WireError, match=r"expected an H\.264 video tensor"):
        wire.video_packets(wire.encode(torch.zeros(1, SIZE, SIZE, dtype=torch.uint8)))
    with pytest.raises(wire.WireError, match="packet_sizes is set"):
        frame = wire.encode(torch.zeros(1, SIZE, SIZE, dtype=torch.uint8))
        frame.packet_sizes.append(1)
        wire.decode(frame)


@pytest.mark.parametrize("bad", [{"video_crf": 52}, {"video_crf": -1}, {"video_preset": "placebo"}])
def test_bad_video_settings_are_refused(bad):
    with pytest.raises(ValueError, match="video_"):
        VideoSettings(**bad)

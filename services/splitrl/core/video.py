"""Grayscale frames as H.264 video, one stream per env: cloud mode's `--codec h264` (docs/design.md, baselines).

A competent engineer streaming camera frames uses a video codec, so this is
the baseline the split has to beat. Each env gets its own encoder on the edge
and its own decoder in inference, for the life of one Act stream:

* zero latency: libx264 with `tune=zerolatency` (no B-frames, no look-ahead,
  no frame threads), so every frame in gives exactly one packet out, and every
  packet gives its frame back at once. Anything else is a bug and raises.
* a stream starts with a keyframe: encoders and decoders are made per stream,
  so a reconnected edge or a restarted inference decodes from the first message.
* frames are the luma plane of a `gray` (4:0:0) picture, full range: a
  lossless setting (crf 0) gives the frame back bit for bit.

Decoding untrusted bytes is an attack surface: any packet that FFmpeg refuses,
or that does not give exactly one frame of the stream's size, raises
VideoDecodeError (a WireError: INVALID_ARGUMENT); the caller drops the stream,
and with it the decoders. FFmpeg itself refuses pictures larger than the
stream's frames (`max_pixels`) before allocating them, and a stream holds at
most `max_rows` decoders.

PyAV (FFmpeg) is imported when the first encoder or decoder is made, not with this module: it is ~26 MB
resident that a process serving no h264 stream (the split modes' edge and inference) does not need.
"""

from __future__ import annotations

import importlib
import math
from fractions import Fraction
from types import ModuleType

import numpy as np
import torch

from splitrl.core import wire
from splitrl.core.config import VideoSettings

#: PSNR recorded for a frame decoded identical to the original (an infinite PSNR would poison a mean).
LOSSLESS_PSNR_DB = 100.0
#: FFmpeg counts a picture's padded width against max_pixels: S x (S + this) admits an S x S frame.
_PADDING_PIXELS = 64


class VideoDecodeError(wire.WireError):
    """An H.264 packet that does not decode to exactly one frame of its stream's size."""


def _pyav() -> ModuleType:
    """The `av` module (PyAV), imported on first use (see the module's docstring)."""
    return importlib.import_module("av")


#: The frame rate written into the stream; it only scales timestamps (x264's rate control uses crf).
_TIME_BASE = Fraction(1, 50)


class FrameEncoder:
    """One env's frames -> H.264 packets, one packet per frame; the first is a keyframe."""

    def __init__(self, frame_size: int, settings: VideoSettings) -> None:
        self.frame_size = frame_size
        self._av = _pyav()
        self._context = self._av.CodecContext.create("libx264", "w")
        self._context.width = self._context.height = frame_size
        self._context.pix_fmt = "gray"
        self._context.time_base = _TIME_BASE
        self._context.options = {
            "tune": "zerolatency",
            "preset": settings.video_preset,
            "crf": str(settings.video_crf),
            "threads": "1",
        }
        self._next_pts = 0

    def encode(self, frame: np.ndarray) -> bytes:
        """uint8 [S, S] -> the one packet that encodes it."""
        picture = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="gray")
        picture.pts = self._next_pts
        self._next_pts += 1
        packets = self._context.encode(picture)
        if len(packets) != 1:
            raise RuntimeError(f"x264 gave {len(packets)} packets for one frame; zero-latency settings are broken")
        return bytes(packets[0])


class FrameDecoder:
    """One env's H.264 packets -> frames, one frame per packet; refuses anything else with WireError."""

    def __init__(self, frame_size: int) -> None:
        self.frame_size = frame_size
        self._av = _pyav()
        self._context = self._av.CodecContext.create("h264", "r")
        self._context.options = {"threads": "1", "max_pixels": str(frame_size * (frame_size + _PADDING_PIXELS))}

    def decode(self, packet: bytes) -> np.ndarray:
        """One packet -> its frame, uint8 [S, S]."""
        try:
            pictures = self._context.decode(self._av.Packet(packet))
        except (self._av.FFmpegError, ValueError) as error:
            raise VideoDecodeError(f"H.264 packet does not decode: {error}") from None
        if len(pictures) != 1:
            raise VideoDecodeError(f"H.264 packet decoded to {len(pictures)} frames, expected exactly 1")
        picture = pictures[0]
        if (picture.width, picture.height) != (self.frame_size, self.frame_size):
            raise VideoDecodeError(
                f"H.264 frame is {picture.width}x{picture.height}, this stream's frames are "
                f"{self.frame_size}x{self.frame_size}"
            )
        if picture.format.name not in ("gray", "yuv420p", "yuvj420p"):
            raise VideoDecodeError(f"H.264 frame has pixel format {picture.format.name}, expected gray")
        luma = picture.planes[0]
        rows = np.frombuffer(memoryview(luma), dtype=np.uint8).reshape(picture.height, luma.line_size)
        return rows[:, : picture.width].copy()


def psnr_db(original: np.ndarray, decoded: np.ndarray) -> float:
    """Peak signal-to-noise ratio of uint8 images in dB; LOSSLESS_PSNR_DB when they are identical."""
    mse = float(np.mean((original.astype(np.float32) - decoded.astype(np.float32)) ** 2))
    return LOSSLESS_PSNR_DB if mse == 0 else min(LOSSLESS_PSNR_DB, 10 * math.log10(255.0**2 / mse))


class VideoStreamEncoder:
    """The edge side of one Act stream: an encoder per env, made when the first batch fixes the env count.

    `mirror_psnr` decodes the packets again, as inference will, to measure the quality the cloud sees.
    """

    def __init__(self, frame_size: int, settings: VideoSettings) -> None:
        self.frame_size, self.settings = frame_size, settings
        self._encoders: list[FrameEncoder] = []
        self._mirrors: list[FrameDecoder] = []

    def encode(self, frames: torch.Tensor) -> wire.Tensor:
        """uint8 [N, S, S] -> the batch as a COMPRESSION_H264 tensor, one packet per env."""
        batch = frames.numpy()
        if not self._encoders:
            self._encoders = [FrameEncoder(self.frame_size, self.settings) for _ in range(len(batch))]
        if len(batch) != len(self._encoders):
            raise ValueError(f"this video stream has {len(self._encoders)} envs, got a batch of {len(batch)}")
        packets = [encoder.encode(frame) for encoder, frame in zip(self._encoders, batch, strict=True)]
        return wire.encode_packets(packets, batch.shape)

    def mirror_psnr(self, frames: torch.Tensor, message: wire.Tensor) -> float:
        """Mean PSNR (dB) over the envs of `message`, the batch `encode` just made of `frames`, as decoded.

        Call it for every batch or for none: the mirror decoders must see each packet of the stream.
        """
        if not self._mirrors:
            self._mirrors = [FrameDecoder(self.frame_size) for _ in self._encoders]
        packets = wire.video_packets(message)
        decoded = (mirror.decode(packet) for mirror, packet in zip(self._mirrors, packets, strict=True))
        return float(np.mean([psnr_db(frame, seen) for frame, seen in zip(frames.numpy(), decoded, strict=True)]))


class VideoStreamDecoder:
    """The inference side of one Act stream: a decoder per env; the env count is fixed by the first batch
    and is at most `max_rows` (each decoder holds its reference frames for the life of the stream)."""

    def __init__(self, frame_size: int, max_rows: int) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.frame_size, self.max_rows = frame_size, max_rows
        self._decoders: list[FrameDecoder] = []

    def decode(self, message: wire.Tensor, *, expect_shape: list[int | None] | None = None) -> torch.Tensor:
        """A COMPRESSION_H264 tensor -> uint8 [N, S, S]; WireError for anything malformed.

        `expect_shape` (None entries match anything) defaults to [any, S, S].
        """
        size = self.frame_size
        packets = wire.video_packets(message, expect_shape=expect_shape or [None, size, size])
        if len(packets) > self.max_rows:
            raise wire.WireError(f"video batch has {len(packets)} rows; a stream may have at most {self.max_rows}")
        if not self._decoders:
            self._decoders = [FrameDecoder(size) for _ in packets]
        if len(packets) != len(self._decoders):
            raise wire.WireError(f"video batch has {len(packets)} rows, this stream has {len(self._decoders)}")
        frames = [decoder.decode(packet) for decoder, packet in zip(self._decoders, packets, strict=True)]
        return torch.from_numpy(np.stack(frames)) if frames else torch.empty((0, size, size), dtype=torch.uint8)

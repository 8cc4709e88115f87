"""A small edge: the environment service process never loads torch (its resident-memory budget is
measured by `splitrl bench throughput`; this pins the cause). Replay, which only stores and hands out
chunks, does without it too, so it restarts without torch's import. In the split modes neither the edge
encoder nor inference loads FFmpeg (PyAV), which only cloud's h264 codec uses. The environment's envs draw
with pygame but load neither its sound nor its image-file libraries (core.envs.UNUSED_PYGAME_MODULES)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ports import free_port


def _flags(service: str) -> list[str]:
    # Nothing listens at the addresses dialled: services dial and back off, bounded by the test.
    if service == "environment":
        return ["--env", "CarRacing-v3", "--num-envs", "2", "--encoder-address", f"127.0.0.1:{free_port()}"]
    if service == "edge-encoder":
        return ["--mode", "split", "--learner-address", f"127.0.0.1:{free_port()}"]
    if service == "inference":
        return ["--mode", "split", "--replay-address", f"127.0.0.1:{free_port()}"]
    return []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("service", "library"),
    [
        ("environment", "libtorch"),
        ("environment", "libSDL2_mixer"),
        ("environment", "libSDL2_image"),
        ("replay", "libtorch"),
        ("edge-encoder", "libavcodec"),
        ("inference", "libavcodec"),
    ],
)
def test_the_service_serves_without_a_library_it_does_not_need(tmp_path: Path, service: str, library: str) -> None:
    port_file = tmp_path / f"{service}.ports.json"
    command = [sys.executable, "-m", "splitrl.cli.main", "serve", service, "--tls", "plaintext"]
    command += [*_flags(service), "--port", "0", "--metrics-port", "0", "--port-file", str(port_file)]
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        while not port_file.exists():
            assert process.poll() is None, process.communicate()[0].decode()[-3000:]
            assert time.monotonic() - started < 60, f"the {service} did not serve within 60 s"
            time.sleep(0.05)
        serving_s = time.monotonic() - started
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        status = Path(f"/proc/{process.pid}/status").read_text()
        assert json.loads(port_file.read_text())["grpc"] > 0
        assert library not in maps, f"the {service} process mapped {library}"
        if library.startswith("libSDL2_"):
            assert "libSDL2-2" in maps, "the environment had not loaded pygame yet: the check proves nothing"
        rss_mb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024
        print(f"{service} serving after {serving_s:.2f} s, resident {rss_mb:.0f} MB, {library} not loaded")
    finally:
        process.terminate()
        process.wait(timeout=30)

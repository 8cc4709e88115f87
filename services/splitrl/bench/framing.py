"""`splitrl bench framing`: the WAN counters against the kernel's, across a veth pair between two namespaces.

The edge services (environment, edge-encoder) run in one network namespace and
the cloud services (replay, inference, learner) in another, joined only by a
veth pair this run creates (addresses 10.200.0.1/.2 exist only inside those
namespaces, and both are deleted afterwards). So every byte the two WAN links
move crosses that veth, and nothing else does. `splitrl_link_bytes_total`
counts serialized protobuf messages; the kernel counts whole frames. The
difference is the framing: Ethernet/IP/TCP headers (estimated per packet) and
the rest, HTTP/2 + gRPC (frame headers, HEADERS, SETTINGS, WINDOW_UPDATE, PING), which a raw socket on the
edge's veth reads frame by frame under plaintext (bench.http2_frames).
`uplink_kbit` shapes the edge's egress with a `tbf` qdisc to emulate a narrow uplink.
Needs root (CAP_NET_ADMIN) and iproute2; `unavailable()` says why not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import Field

from splitrl.bench.http2_frames import FrameTally
from splitrl.core import scrape
from splitrl.core.config import TlsMode
from splitrl.core.metrics import ENV_STEPS, WAN_LINKS
from splitrl.run.launcher import Child, serving_addresses, spawn, stop_all, wait_ready
from splitrl.run.plan import START_ORDER, amended, plan, prepare_tls
from splitrl.run.settings import RunSettings

EDGE_IP, CLOUD_IP = "10.200.0.1", "10.200.0.2"
CLOUD_SERVICES = ("replay", "inference", "learner")
#: Per packet on the veth: Ethernet 14 + IPv4 20 + TCP 20 + TCP timestamp option 12 bytes.
L2_L4_HEADER_BYTES = 66


class FramingSettings(RunSettings):
    """Run the stack split across two network namespaces and compare WAN counters with the veth's byte counters."""

    uplink_kbit: int | None = Field(None, ge=8, description="Shape the edge's uplink to this rate (tbf), in kbit/s.")
    timeout_s: float = Field(600.0, gt=0, description="Longest the run may take before it is stopped.")
    tls: TlsMode = Field(
        "plaintext",
        description="Links' security; plaintext by default so the framing is HTTP/2 and gRPC only "
        "(mtls adds TLS records to it).",
    )


@dataclass(frozen=True)
class FramingResult:
    """Bytes over the run. `counted_*`: splitrl's WAN counters at the edge; `kernel_*`: the edge veth's."""

    mode: str
    codec: str
    env_steps: int
    seconds: float
    uplink_kbit: int | None
    counted_up: int
    counted_down: int
    kernel_up: int
    kernel_down: int
    packets_up: int
    packets_down: int
    #: HTTP/2 frames on the veth by type, both ways (empty under TLS, where frames are inside records).
    frames: dict[str, int] = field(default_factory=dict)
    #: Their bytes, each frame with its 9 B header.
    frame_bytes: dict[str, int] = field(default_factory=dict)
    #: TCP payload bytes the frame reader could not cut into frames (a segment the raw socket missed), and the
    #: packets the kernel dropped before the reader got them.
    unparsed_bytes: int = 0
    dropped_packets: int = 0

    @property
    def counted(self) -> int:
        return self.counted_up + self.counted_down

    @property
    def kernel(self) -> int:
        return self.kernel_up + self.kernel_down

    @property
    def l2_l4_headers(self) -> int:
        return (self.packets_up + self.packets_down) * L2_L4_HEADER_BYTES

    @property
    def http2_grpc(self) -> int:
        """Kernel bytes that are neither counted payload nor Ethernet/IP/TCP headers."""
        return self.kernel - self.counted - self.l2_l4_headers

    def markdown(self) -> str:
        def share(part: int) -> str:
            return f"{100 * part / self.kernel:.1f}%" if self.kernel else "n/a"

        shaped = f", uplink shaped to {self.uplink_kbit} kbit/s" if self.uplink_kbit else ""
        return "\n".join(
            [
                f"## Counters vs the kernel: {self.mode} ({self.codec}){shaped}",
                "",
                f"{self.env_steps:,} env steps in {self.seconds:.1f} s ({self.env_steps / self.seconds:,.0f} steps/s)",
                "across a veth pair between an edge and a cloud network namespace.",
                "",
                "| | uplink | downlink | total | share of kernel bytes |",
                "| --- | ---: | ---: | ---: | ---: |",
                f"| splitrl WAN counters (protobuf bytes) | {self.counted_up:,} | {self.counted_down:,} "
                f"| {self.counted:,} | {share(self.counted)} |",
                f"| kernel, veth bytes | {self.kernel_up:,} | {self.kernel_down:,} | {self.kernel:,} | 100% |",
                f"| Ethernet/IP/TCP headers ({L2_L4_HEADER_BYTES} B x {self.packets_up + self.packets_down:,} packets) "
                f"| | | {self.l2_l4_headers:,} | {share(self.l2_l4_headers)} |",
                f"| HTTP/2 + gRPC framing (the rest) | | | {self.http2_grpc:,} | {share(self.http2_grpc)} |",
                *self._frame_rows(share),
                "",
                f"Per env step: {self.counted / max(self.env_steps, 1):,.1f} B counted, "
                f"{self.kernel / max(self.env_steps, 1):,.1f} B on the wire (kernel).",
                "",
            ]
        )

    def _frame_rows(self, share: Callable[[int], str]) -> list[str]:
        """The framing row cut by frame type, where the frames were read."""
        if not self.frame_bytes:
            return []
        data_headers = self.frame_bytes.get("DATA", 0) - self.counted
        messages = self.frames.get("DATA", 0)
        rows = [
            f"| - DATA frame + gRPC message headers ({messages:,} DATA frames) | | | {data_headers:,} "
            f"| {share(data_headers)} |"
        ]
        for kind in ("WINDOW_UPDATE", "PING"):
            rows.append(
                f"| - {kind} frames ({self.frames.get(kind, 0):,}) | | | {self.frame_bytes.get(kind, 0):,} "
                f"| {share(self.frame_bytes.get(kind, 0))} |"
            )
        others = {kind: n for kind, n in self.frames.items() if kind not in ("DATA", "WINDOW_UPDATE", "PING")}
        other_bytes = sum(self.frame_bytes[kind] for kind in others)
        named = ", ".join(f"{kind} {n:,}" for kind, n in sorted(others.items()))
        rows.append(f"| - other frames ({named}) | | | {other_bytes:,} | {share(other_bytes)} |")
        if self.unparsed_bytes:
            missed, dropped = self.unparsed_bytes, self.dropped_packets
            rows.append(f"| - not read as frames ({dropped:,} packets dropped) | | | {missed:,} | {share(missed)} |")
        return rows


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_NET_ADMIN)"
    probe = f"splitrl-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done.stdout


def _ip(*args: str) -> str:
    return _run("ip", *args)


class _Namespaces:
    """Two namespaces joined by a veth pair; `delete` removes both (and with them the pair)."""

    def __init__(self, tag: str) -> None:
        self.edge, self.cloud = f"splitrl-edge-{tag}", f"splitrl-cloud-{tag}"
        self.edge_dev, self.cloud_dev = f"srle{tag}"[:15], f"srlc{tag}"[:15]

    def create(self, uplink_kbit: int | None) -> None:
        _ip("netns", "add", self.edge)
        _ip("netns", "add", self.cloud)
        _ip(
            "link",
            "add",
            self.edge_dev,
            "netns",
            self.edge,
            "type",
            "veth",
            "peer",
            self.cloud_dev,
            "netns",
            self.cloud,
        )
        for ns, dev, address in ((self.edge, self.edge_dev, EDGE_IP), (self.cloud, self.cloud_dev, CLOUD_IP)):
            _ip("-n", ns, "addr", "add", f"{address}/30", "dev", dev)
            # One segment per GSO packet: the veth then counts wire-sized packets, so the per-packet
            # header estimate below holds (merged GSO segments would hide most headers).
            _ip("-n", ns, "link", "set", dev, "gso_max_segs", "1", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        if uplink_kbit:
            tbf = ("tc", "-n", self.edge, "qdisc", "add", "dev", self.edge_dev, "root", "tbf")
            _run(*tbf, "rate", f"{uplink_kbit}kbit", "burst", "32kbit", "latency", "400ms")

    def edge_counters(self) -> dict[str, int]:
        stats = json.loads(_ip("-n", self.edge, "-s", "-j", "link", "show", "dev", self.edge_dev))[0]["stats64"]
        return {
            "tx_bytes": stats["tx"]["bytes"],
            "rx_bytes": stats["rx"]["bytes"],
            "tx_packets": stats["tx"]["packets"],
            "rx_packets": stats["rx"]["packets"],
        }

    def delete(self) -> None:
        for ns in (self.edge, self.cloud):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def measure_framing(settings: FramingSettings, run_dir: Path) -> FramingResult:
    """Run `settings.steps` env steps with edge and cloud in their own namespaces; compare the byte counts."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics").mkdir(exist_ok=True)
    namespaces = _Namespaces(str(os.getpid() % 1_000_000))
    children: dict[str, Child] = {}
    # Frames are readable under plaintext only; the tally starts before any connection, so it sees every SYN.
    tally = FrameTally(namespaces.edge_dev, namespace=namespaces.edge) if settings.tls == "plaintext" else None
    try:
        namespaces.create(settings.uplink_kbit)
        with tally or nullcontext():
            try:
                seconds = _run_split(settings, run_dir, namespaces, children)
            finally:
                stop_all(children)
        counters = namespaces.edge_counters()
    finally:
        namespaces.delete()
    edge = scrape.link_counts([(run_dir / "metrics" / "edge-encoder.prom").read_text()])
    counted = {
        direction: sum(b for (link, _), b in scrape.link_totals(edge, direction=direction).items() if link in WAN_LINKS)
        for direction in ("sent", "received")
    }
    steps = scrape.total([(run_dir / "metrics" / "environment.prom").read_text()], f"{ENV_STEPS}_total")
    return FramingResult(
        mode=settings.mode,
        codec=_wan_codec(settings),
        env_steps=int(steps),
        seconds=seconds,
        uplink_kbit=settings.uplink_kbit,
        counted_up=counted["sent"],
        counted_down=counted["received"],
        kernel_up=counters["tx_bytes"],
        kernel_down=counters["rx_bytes"],
        packets_up=counters["tx_packets"],
        packets_down=counters["rx_packets"],
        frames={kind: tally.counts.count_of(kind) for kind in tally.counts.kinds()} if tally else {},
        frame_bytes={kind: tally.counts.bytes_of(kind) for kind in tally.counts.kinds()} if tally else {},
        unparsed_bytes=tally.counts.unparsed_bytes if tally else 0,
        dropped_packets=tally.counts.dropped_packets if tally else 0,
    )


def _run_split(settings: FramingSettings, run_dir: Path, namespaces: _Namespaces, children: dict[str, Child]) -> float:
    """Start the edge services in the edge namespace and the cloud's in the cloud's (into `children`, which the
    caller stops), and wait for the environment to finish its steps; the seconds that took once all served."""
    hosts = {name: CLOUD_IP if name in CLOUD_SERVICES else "127.0.0.1" for name in START_ORDER}
    prepare_tls(settings, run_dir)
    for name in START_ORDER:
        planned = plan(settings, run_dir, serving_addresses(children, hosts), hosts=hosts)[name]
        if settings.tls != "plaintext":  # peers are dialled at CLOUD_IP, which the loopback certificates lack
            planned = amended(planned, tls_server_name="localhost")
        namespace = namespaces.cloud if name in CLOUD_SERVICES else namespaces.edge
        children[name] = spawn(name, planned, run_dir, ("ip", "netns", "exec", namespace))
        wait_ready(children[name], run_dir, settings.start_timeout_s)
    started = time.monotonic()
    try:
        children["environment"].process.wait(settings.timeout_s)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"the run did not finish within {settings.timeout_s:.0f}s; see {run_dir / 'logs'}") from None
    return time.monotonic() - started


def _wan_codec(settings: FramingSettings) -> str:
    """What crossed the WAN, as the network report names it (h264 with its CRF)."""
    if settings.mode != "cloud":
        return f"{settings.activation_codec} w{settings.width}"
    return f"h264 crf{settings.video_crf}" if settings.codec == "h264" else settings.codec


def run_framing_bench(settings: FramingSettings) -> int:
    """CLI entry: measure, print the table, and save framing.md / framing.json in the run directory."""
    reason = unavailable()
    if reason is not None:
        print(f"splitrl bench framing: cannot run here: {reason}")
        return 2
    run_dir = settings.run_dir or Path("runs") / f"framing-{settings.mode}"
    result = measure_framing(settings, run_dir)
    text = result.markdown()
    (run_dir / "framing.md").write_text(text)
    (run_dir / "framing.json").write_text(json.dumps(asdict(result), indent=2))
    print(text)
    return 0

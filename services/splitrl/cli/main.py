"""`splitrl`: run one service (`serve SERVICE`), train locally (`up`), or redraw a run's plot (`plot RUN_DIR`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from splitrl.cli.args import add_settings_arguments, settings_from_args


def _services() -> dict[str, tuple[type, Callable[..., Any], str]]:
    # Imported here so `splitrl --help` stays fast and each service imports only what it needs.
    from splitrl.edge_encoder.service import EdgeEncoderService
    from splitrl.edge_encoder.settings import EdgeEncoderSettings
    from splitrl.environment.service import EnvironmentService
    from splitrl.environment.settings import EnvironmentSettings
    from splitrl.inference.service import InferenceService
    from splitrl.inference.settings import InferenceSettings
    from splitrl.learner.service import LearnerService
    from splitrl.learner.settings import LearnerSettings
    from splitrl.replay.service import ReplayService
    from splitrl.replay.settings import ReplaySettings

    return {
        "environment": (
            EnvironmentSettings,
            EnvironmentService,
            "Step gymnasium envs; stream frames to the edge-encoder.",
        ),
        "edge-encoder": (EdgeEncoderSettings, EdgeEncoderService, "Stack frames, encode (split), dial inference."),
        "inference": (InferenceSettings, InferenceService, "Batch edge streams, act, write trajectories to replay."),
        "replay": (ReplaySettings, ReplayService, "Store trajectory chunks; serve samples."),
        "learner": (LearnerSettings, LearnerService, "Train the policy with PPO; publish weights to inference."),
    }


def build_parser() -> argparse.ArgumentParser:
    from splitrl.cli.up import UpSettings

    parser = argparse.ArgumentParser(
        prog="splitrl",
        description="Reinforcement learning split between an edge and a cloud over gRPC, every byte counted.",
        epilog="Every flag can also be set as an environment variable: --num-envs is SPLITRL_NUM_ENVS.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="Run one service as this process.")
    services = serve.add_subparsers(dest="service", required=True, metavar="SERVICE")
    for name, (settings_cls, _, help_text) in _services().items():
        add_settings_arguments(services.add_parser(name, help=help_text, description=help_text), settings_cls)
    up = commands.add_parser(
        "up",
        help="Train locally: start every service on loopback, run N env steps, write a summary.",
        description=UpSettings.__doc__,
    )
    add_settings_arguments(up, UpSettings)
    plot = commands.add_parser(
        "plot",
        help="Redraw RUN_DIR/learning.png from RUN_DIR/summary.json.",
        description="Redraw RUN_DIR/learning.png (learning curve, bytes per link) from RUN_DIR/summary.json.",
    )
    plot.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="A directory `splitrl up` wrote.")
    return parser


def _plot(parser: argparse.ArgumentParser, run_dir: Path) -> int:
    from splitrl.cli.plots import plot_run

    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        parser.exit(2, f"splitrl plot: cannot read {path}: {error}\n")
    if not isinstance(summary, dict):
        parser.exit(2, f"splitrl plot: {path} is not a run summary (a JSON object)\n")
    print(plot_run(summary, run_dir / "learning.png"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        from splitrl.core.service import run_service

        settings_cls, service_cls, _ = _services()[args.service]
        try:
            settings: Any = settings_from_args(settings_cls, args)
        except ValueError as error:
            parser.exit(2, f"splitrl serve {args.service}: {error}\n")
        return run_service(lambda metrics: service_cls(settings, metrics), settings)
    if args.command == "plot":
        return _plot(parser, args.run_dir)
    from splitrl.cli.up import UpSettings, run_up

    try:
        up_settings = settings_from_args(UpSettings, args)
    except ValueError as error:
        parser.exit(2, f"splitrl up: {error}\n")
    return run_up(up_settings)


if __name__ == "__main__":
    sys.exit(main())

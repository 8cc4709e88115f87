"""`splitrl`: run one service (`serve SERVICE`), train locally (`up`, `up --resume RUN_DIR`), play a trained
agent (`eval RUN_DIR`), redraw a run's plot (`plot RUN_DIR`), benchmark
(`bench network|framing|learning|throughput|replicas`), report on runs (`report RUN_DIR...`) or pretrain a split
edge's encoder (`pretrain-encoder`)."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import io
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from splitrl.core.args import (
    add_config_argument,
    add_settings_arguments,
    given_values,
    settings_from_args,
    validate_settings,
)
from splitrl.run.files import load_evals
from splitrl.run.registry import SERVICES, load


def build_parser(serving: str | None = None) -> argparse.ArgumentParser:
    """The `splitrl` parser. `serving`: a name in SERVICES; the parser then knows `serve SERVING` only and
    imports only that service's settings (the environment process is ~11 MB smaller for it)."""
    parser = argparse.ArgumentParser(
        prog="splitrl",
        description="Reinforcement learning split between an edge and a cloud over gRPC, every byte counted.",
        epilog="Every flag can also be set as an environment variable: --num-envs is SPLITRL_NUM_ENVS.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="Run one service as this process.")
    services = serve.add_subparsers(dest="service", required=True, metavar="SERVICE")
    for name, served in SERVICES.items():
        if serving in (None, name):
            service = services.add_parser(name, help=served.help, description=served.help)
            add_settings_arguments(service, load(served.settings))
            add_config_argument(service, f"Run recipe (the file `splitrl up --config` takes): {name} takes its share")
    if serving is None:
        _add_commands(commands)
    return parser


def _add_commands(commands: Any) -> None:
    """Every command but `serve`."""
    from splitrl.run.settings import EvalSettings, PretrainSettings, RunSettings

    up = commands.add_parser(
        "up",
        help="Train locally: start every service on loopback, run N env steps, write a summary.",
        description=RunSettings.__doc__,
    )
    add_settings_arguments(up, RunSettings)
    add_config_argument(up)
    up.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="Go on with the run in RUN_DIR from its checkpoints and curve, with the settings it started with; "
        "flags given now override them (e.g. a larger --steps).",
    )
    evaluate = commands.add_parser(
        "eval",
        help="Play a run's trained agent on unseen episodes: mean, IQM, std; --record films it.",
        description=EvalSettings.__doc__,
    )
    evaluate.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="A directory `splitrl up` wrote.")
    add_settings_arguments(evaluate, EvalSettings)
    pretrain = commands.add_parser(
        "pretrain-encoder",
        help="Train a split edge's encoder alone on the edge (an autoencoder of random-policy frames): --encoder-init.",
        description=PretrainSettings.__doc__,
    )
    add_settings_arguments(pretrain, PretrainSettings)
    add_config_argument(pretrain, "Run recipe (the file `splitrl up --config` takes): its env, shapes and seed")
    plot = commands.add_parser(
        "plot",
        help="Redraw RUN_DIR/learning.png from RUN_DIR/summary.json.",
        description="Redraw RUN_DIR/learning.png (learning curve, bytes per link) from RUN_DIR/summary.json.",
    )
    plot.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="A directory `splitrl up` wrote.")
    _add_bench_and_report(commands)
    certs = commands.add_parser(
        "certs",
        help="Make a CA and one role certificate per service and per edge device (secrets for compose and k8s).",
        description="Write ca.pem, ca-key.pem and NAME.pem + NAME-key.pem for each host and edge device (EC P-256; "
        "names NAME, localhost, 127.0.0.1, ::1; server and client use) under OUT. Each certificate names its "
        "holder as spiffe://splitrl/ROLE/INSTANCE, which servers authorise each RPC by. Mount ca.pem and a "
        "holder's pair; keep ca-key.pem to add edges later (--reuse-ca).",
    )
    certs.add_argument("--out", type=Path, required=True, help="Directory to write (created; files replaced).")
    certs.add_argument(
        "--hosts",
        default="replay,inference,learner,edge-encoder,environment",
        help="Comma-separated NAME or NAME=ROLE, one certificate each; NAME is what peers dial, its role is read "
        "from it (inference-1: inference) unless given (default: the five services). Empty: none.",
    )
    certs.add_argument(
        "--edges",
        default="",
        help="Comma-separated edge device ids: each gets edge-encoder-ID and environment-ID certificates "
        "(identities edge-encoder/ID and environment/ID, which a deny list names to revoke the device).",
    )
    certs.add_argument(
        "--reuse-ca",
        action="store_true",
        help="Sign with the CA already in OUT (ca.pem, ca-key.pem) instead of making a new one: adds certificates "
        "(a new edge, a renewal) without reissuing the rest.",
    )
    certs.add_argument("--days", type=int, default=365, help="Days the certificates are valid.")
    certs.add_argument(
        "--dns-suffixes",
        default="",
        help="Comma-separated suffixes: HOST.SUFFIX joins each host's names (e.g. k8s: NAMESPACE.svc).",
    )
    certs.add_argument(
        "--names",
        default="",
        help="Comma-separated names (or IPs) added to every certificate, e.g. the cloud's external name edges dial.",
    )


def _benches() -> dict[str, tuple[Any, str]]:
    """`splitrl bench NAME`: its settings class and help line (settings modules are light to import)."""
    from splitrl.bench.framing import FramingSettings
    from splitrl.bench.settings import (
        LearningBenchSettings,
        NetworkBenchSettings,
        ReplicasBenchSettings,
        ThroughputBenchSettings,
    )

    return {
        "network": (
            NetworkBenchSettings,
            "WAN bytes per env step and final return for modes x codecs x widths (resumable).",
        ),
        "framing": (
            FramingSettings,
            "WAN counters vs kernel bytes on a veth between an edge and a cloud namespace (root).",
        ),
        "learning": (
            LearningBenchSettings,
            "Train rows x seeds to a frame budget in resumable segments with evaluations; return vs frames and bytes.",
        ),
        "throughput": (
            ThroughputBenchSettings,
            "Env steps/s of the stack per mode vs a single-process loop; hop latency, CPU; link vs raw TCP.",
        ),
        "replicas": (
            ReplicasBenchSettings,
            "Simulated edge streams into 1 vs N inference replicas: env steps/s, latency, batches, CPU.",
        ),
    }


def _add_bench_and_report(commands: Any) -> None:
    from splitrl.bench.settings import RETURN_TOLERANCE

    bench = commands.add_parser("bench", help="Benchmarks that print and save figures.")
    benches = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name, (settings_cls, help_text) in _benches().items():
        add_settings_arguments(benches.add_parser(name, help=help_text, description=settings_cls.__doc__), settings_cls)
    report = commands.add_parser(
        "report",
        help="Table (markdown, CSV) and figures of WAN bytes and return from finished runs.",
        description="Read every summary.json under RUN_DIR... (runs of `splitrl up` or `splitrl bench network`) "
        "and write report.md, runs.csv and PNG figures of WAN bytes per step, cumulative WAN bytes and return.",
    )
    report.add_argument(
        "run_dirs", type=Path, nargs="+", metavar="RUN_DIR", help="A run directory, or one holding runs."
    )
    report.add_argument("--out", type=Path, default=None, help="Where to write (default: FIRST_RUN_DIR/report).")
    report.add_argument("--return-window", type=float, default=0.2, help="Final return: last share of env steps.")
    report.add_argument(
        "--return-tolerance",
        type=float,
        default=RETURN_TOLERANCE,
        help="Baseline: the cheapest cloud row whose final return is within this share of `cloud frame`'s.",
    )


def _report(
    parser: argparse.ArgumentParser, run_dirs: list[Path], out: Path | None, window: float, tolerance: float
) -> int:
    from splitrl.bench.framing import FramingResult
    from splitrl.bench.report import write_report
    from splitrl.bench.results import find_runs, load_run

    if not 0 < window <= 1:
        parser.exit(2, f"splitrl report: --return-window must be in (0, 1], got {window}\n")
    if not 0 <= tolerance < 1:
        parser.exit(2, f"splitrl report: --return-tolerance must be in [0, 1), got {tolerance}\n")
    try:
        runs = [load_run(run_dir, window) for run_dir in find_runs(run_dirs)]
        framing = [
            FramingResult(**json.loads(path.read_text())).markdown()
            for run_dir in run_dirs
            for path in sorted(run_dir.rglob("framing.json"))
        ]
    except (OSError, ValueError, KeyError, TypeError) as error:
        parser.exit(2, f"splitrl report: {error}\n")
    for path in write_report(runs, out or run_dirs[0] / "report", framing, tolerance):
        print(f"wrote {path}")
    return 0


def _plot(parser: argparse.ArgumentParser, run_dir: Path) -> int:
    from splitrl.cli.plots import plot_run

    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        parser.exit(2, f"splitrl plot: cannot read {path}: {error}\n")
    if not isinstance(summary, dict):
        parser.exit(2, f"splitrl plot: {path} is not a run summary (a JSON object)\n")
    print(plot_run(summary, run_dir / "learning.png", load_evals(run_dir)))
    return 0


def _eval(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from splitrl.cli.plots import plot_run
    from splitrl.run.evaluate import evaluate
    from splitrl.run.settings import EvalSettings

    try:
        settings = settings_from_args(EvalSettings, args)
        result = evaluate(args.run_dir, settings)
    except (ValueError, OSError) as error:
        parser.exit(2, f"splitrl eval: {error}\n")
    solved = result["at_threshold"]
    print(
        f"{args.run_dir}: policy version {result['policy_version']} after {result['env_steps']} env steps, "
        f"{result['episodes']} unseen episodes ({'deterministic' if settings.deterministic else 'sampled'} actions): "
        f"mean {result['mean']:.1f}, IQM {result['iqm']:.1f}, std {result['std']:.1f}, "
        f"min {result['min']:.1f}, max {result['max']:.1f}; {result['out_of_time']} cut by the time limit"
        + ("" if solved is None else f", {solved} at or above the env's solved score {result['reward_threshold']:g}")
        + f" ({result['wall_seconds']:.0f} s)"
    )
    if settings.record is not None:
        print(f"recorded {settings.record}")
    summary = args.run_dir / "summary.json"
    if summary.exists():
        print(plot_run(json.loads(summary.read_text()), args.run_dir / "learning.png", load_evals(args.run_dir)))
    return 0


def _pretrain(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from splitrl.edge_encoder.pretrained import quality
    from splitrl.run.plan import recipe_values
    from splitrl.run.pretrain import pretrain_encoder
    from splitrl.run.settings import PretrainSettings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # the steps' progress
    try:
        settings = settings_from_args(PretrainSettings, args, read_config=recipe_values)
        result = pretrain_encoder(settings)
    except (ValueError, OSError) as error:
        parser.exit(2, f"splitrl pretrain-encoder: {error}\n")
    print(
        f"wrote {settings.out}: {result.steps} Adam steps in {result.seconds:.0f} s on {result.stacks} frame stacks "
        f"of a random policy; reconstruction MSE on the last {result.held_out} (held out) {result.held_out_mse:.5f} "
        f"against {result.mean_predictor_mse:.5f} for the training stacks' mean ({quality(result):.0%} of it removed)"
    )
    return 0


def _bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from splitrl.bench.framing import run_framing_bench
    from splitrl.bench.learning import run_learning_bench
    from splitrl.bench.network import run_network_bench
    from splitrl.bench.replicas import run_replicas_bench
    from splitrl.bench.throughput import run_throughput_bench

    runners: dict[str, Callable[[Any], int]] = {
        "network": run_network_bench,
        "framing": run_framing_bench,
        "learning": run_learning_bench,
        "throughput": run_throughput_bench,
        "replicas": run_replicas_bench,
    }
    settings_cls, _ = _benches()[args.bench]
    try:
        settings: Any = settings_from_args(settings_cls, args)
    except ValueError as error:
        parser.exit(2, f"splitrl bench {args.bench}: {error}\n")
    return runners[args.bench](settings)


def _split(names: str) -> list[str]:
    return [name.strip() for name in names.split(",") if name.strip()]


def _certs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from splitrl.core.certs import generate

    try:
        pki = generate(
            args.out,
            _split(args.hosts),
            args.days,
            dns_suffixes=_split(args.dns_suffixes),
            extra_names=_split(args.names),
            edges=_split(args.edges),
            reuse_ca=args.reuse_ca,
        )
    except (OSError, ValueError) as error:
        parser.exit(2, f"splitrl certs: {error}\n")
    made = "signed with" if args.reuse_ca else "wrote"
    print(f"{made} {pki.ca} (trust) and {pki.ca_key} (keep private; not mounted)")
    for host, (cert, key) in pki.pairs.items():
        print(f"  {host}: {cert} {key}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _dump_stacks_on_sigusr1()
    serving = argv[1] if len(argv) > 1 and argv[0] == "serve" and argv[1] in SERVICES else None
    parser = build_parser(serving)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(parser, args.service, args)
    if args.command == "certs":
        return _certs(parser, args)
    if args.command == "eval":
        return _eval(parser, args)
    if args.command == "pretrain-encoder":
        return _pretrain(parser, args)
    if args.command == "plot":
        return _plot(parser, args.run_dir)
    if args.command == "report":
        return _report(parser, args.run_dirs, args.out, args.return_window, args.return_tolerance)
    if args.command == "bench":
        return _bench(parser, args)
    return _up(parser, args)


def _dump_stacks_on_sigusr1() -> None:
    """`kill -USR1 PID`: every thread's stack to stderr (a service's: its log), to see what a stuck run does.
    Not where stderr has no file descriptor (main() called in-process with its output captured)."""
    if hasattr(signal, "SIGUSR1"):
        with contextlib.suppress(io.UnsupportedOperation, ValueError, AttributeError):
            faulthandler.register(signal.SIGUSR1, all_threads=True)


def _serve(parser: argparse.ArgumentParser, name: str, args: argparse.Namespace) -> int:
    from splitrl.core.memory import one_heap

    one_heap()  # before the service's imports start threads of their own (gRPC's, torch's)
    from splitrl.core import authz, security
    from splitrl.core.ports import PortUnavailable
    from splitrl.core.service import run_service
    from splitrl.core.state_files import EXIT_CANNOT_WRITE, EXIT_CORRUPT_STATE, CorruptState, cannot_write

    def recipe_share(path: Path, _: Any) -> dict[str, Any]:
        from splitrl.run.plan import recipe_share  # the whole run's settings: imported only for --config

        return recipe_share(path, name)

    try:
        settings: Any = settings_from_args(load(SERVICES[name].settings), args, read_config=recipe_share)
        transport = security.load(settings)  # missing or unreadable TLS files: the fix is printed, not a traceback
        authz.deny_list_for(settings.deny_list_file, transport.mode)
    except ValueError as error:
        parser.exit(2, f"splitrl serve {name}: {error}\n")
    service_cls = load(SERVICES[name].service)
    try:
        return run_service(lambda metrics: service_cls(settings, metrics), settings, name)
    except PortUnavailable as error:  # a port taken is the user's to fix: what and how, not a traceback
        parser.exit(1, f"splitrl serve {name}: {error}\n")
    except CorruptState as error:  # no good state file left: what is wrong with which file, not a traceback
        parser.exit(EXIT_CORRUPT_STATE, f"splitrl serve {name}: refusing to start: {error}\n")
    except OSError as error:
        if not cannot_write(error):
            raise
        parser.exit(EXIT_CANNOT_WRITE, f"splitrl serve {name}: cannot write its files: {error}\n")


def _up(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from splitrl.cli.up import run_up
    from splitrl.core.envs import check_env
    from splitrl.run import files as run_dir
    from splitrl.run.settings import RunSettings

    try:
        given = given_values(RunSettings, args, os.environ)
        if args.resume is not None:
            if "run_dir" in given and Path(given["run_dir"]) != args.resume:
                raise ValueError(f"--resume {args.resume} and --run-dir {given['run_dir']} name different runs")
            given = {**run_dir.load_settings(args.resume), **given, "run_dir": args.resume}
        up_settings = validate_settings(RunSettings, given)
        if args.resume is None and up_settings.run_dir is not None:
            run_dir.refuse_a_new_run_over_checkpoints(up_settings.run_dir)
        check_env(up_settings.env, up_settings.env_kwargs)  # an unknown id or missing package: before any start
    except ValueError as error:
        parser.exit(2, f"splitrl up: {error}\n")
    return run_up(up_settings, resume=args.resume is not None)


if __name__ == "__main__":
    sys.exit(main())

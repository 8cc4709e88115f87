"""`plan`: every service's settings for one run, built in the parent process.

A run is described once (`RunSettings`). Each service's model inherits some of the same groups
(`SHARED_GROUPS`); `plan` copies the run's values for exactly those groups, then adds what only the
placement knows (addresses, ports, files). Building the models here validates every value before any
process starts: a wrong key or value fails in the parent, naming the service. `splitrl up`, the benches and
the integration tests' stack all start services from a plan.

A plan is keyed by instance: a service's name, or for replica K >= 1 of a replicated service (inference,
`--inference-replicas`; replay, `--replay-shards`) NAME-K. Replica 0 keeps the plain name, so a run without
replicas is named as before. Each replica has its own ports, log and final metrics, and the service's
certificate. The learner and the edge dial every inference replica, the learner every replay shard (a
comma-separated address list); inference replica r writes to replay shard r mod K; learner ranks
(`--learners`) meet at rank 0's host on --learner-rendezvous-port.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from splitrl.core import certs
from splitrl.core.args import load_config, validate_settings
from splitrl.core.chunk_content import stored_observation_shape
from splitrl.core.config import ServerSettings, Settings, shard_index
from splitrl.core.envs import action_spec_of
from splitrl.core.spec import ActionSpec
from splitrl.edge_encoder.settings import observation_store_size_for
from splitrl.run import files as run_dir_files
from splitrl.run.registry import SERVICES, load
from splitrl.run.settings import SHARED_GROUPS, RunSettings

#: Services in dial order: each dials only services before it, so they start in this order.
START_ORDER = tuple(SERVICES)
SERVICE_SETTINGS: dict[str, type[ServerSettings]] = {name: load(served.settings) for name, served in SERVICES.items()}
S = TypeVar("S", bound=ServerSettings)


#: A service instance's port file is RUN_DIR/NAME + this: {"grpc": N, "metrics": N, "pid": N} once it serves.
PORT_FILE_SUFFIX = ".ports.json"


def port_files(run_dir: Path) -> dict[str, Path]:
    """The port files of `run_dir` written so far, by service instance name."""
    return {path.name.removesuffix(PORT_FILE_SUFFIX): path for path in run_dir.glob(f"*{PORT_FILE_SUFFIX}")}


def replica_count(run: RunSettings, service: str) -> int:
    """Processes `service` runs as in `run`: inference replicas, replay shards, learner ranks, one of the rest."""
    return {"inference": run.inference_replicas, "replay": run.replay_shards, "learner": run.learners}.get(service, 1)


def replica_name(service: str, replica: int) -> str:
    """The instance name of replica `replica` of `service`: NAME for replica 0, NAME-K after it."""
    return service if replica == 0 else f"{service}-{replica}"


def instance_names(run: RunSettings) -> list[str]:
    """Every process of `run`, in start order: each service's replicas (NAME, NAME-1, ...) in START_ORDER."""
    return [replica_name(service, k) for service in START_ORDER for k in range(replica_count(run, service))]


def service_of(instance: str) -> str:
    """The service an instance name runs ("inference-1" -> "inference"; "edge-encoder" -> itself)."""
    service, _, replica = instance.rpartition("-")
    return service if replica.isdigit() and service in SERVICE_SETTINGS else instance


#: The address of a service that does not serve yet; plan again once it does (services start in START_ORDER).
NOT_SERVING = "127.0.0.1:0"


def shared_values(source: Settings, model: type[Settings]) -> dict[str, Any]:
    """`source`'s values of every shared group that both it and `model` have (a run has them all; a bench's
    settings some): what a service (or a run) built from `source` takes of it."""
    groups = [group for group in SHARED_GROUPS if isinstance(source, group) and issubclass(model, group)]
    return {name: getattr(source, name) for group in groups for name in group.model_fields}


def run_values(run: RunSettings, name: str, done_steps: int = 0) -> dict[str, Any]:
    """What service `name` takes from the run description itself, wherever it is placed: its shared groups,
    torch threads, and the fields computed from run fields (see DERIVED_FROM). `done_steps`: as in `plan`."""
    values = {**shared_values(run, SERVICE_SETTINGS[name]), "torch_threads": run.torch_threads}
    replay_chunks = replay_size(run)
    if name == "replay":
        values["max_size"] = replay_chunks
        values["fsync"] = run.replay_fsync
        values["action_space"] = _action_space(run.env, json.dumps(run.env_kwargs, sort_keys=True))
        values["observation_shape"] = list(stored_observation_shape(run.mode == "cloud", run.network_config()))
        if run.train_every_step:
            values["samples_per_insert"], values["error_buffer"] = 1.0, float(unsampled_chunks_bound(run) - 1)
    if name == "inference" and run.train_every_step:  # waiting inserts make acting wait, a round of chunks later
        values["max_pending_inserts"] = run.num_envs
    if name == "edge-encoder":
        values["observation_store_size"] = observation_store_size_for(
            replay_chunks, run.unroll_length, run.chunks_per_update, run.num_envs
        )
    if name == "learner":
        values["nice"] = run.learner_nice
    if name == "environment":
        values["seed"] = run.seed + done_steps  # a resumed run plays tracks it has not played yet
        values["max_steps"] = run.steps - done_steps
    return values


@functools.lru_cache(maxsize=8)  # a run is planned again as each service starts; the env is made once
def _action_space(env_id: str, env_kwargs_json: str) -> ActionSpec:
    return action_spec_of(env_id, json.loads(env_kwargs_json))


def replay_size(run: RunSettings) -> int:
    """Chunks each replay table holds: --replay-max-size, or two updates' worth."""
    return run.replay_max_size or 2 * run.chunks_per_update


def unsampled_chunks_bound(run: RunSettings) -> int:
    """--train-every-step: the chunks one replay shard holds that no update has taken, at most; an insert beyond
    them waits (a samples-per-insert rate limiter of 1 with this bound as its buffer).

    One update's share of the shard: the envs fill it while the learner trains on the previous one, so the
    learner trains on chunks about one update old and nothing is evicted (never above the table's size). Two
    updates' worth, as this was first, let chunks wait a second update: a policy lag of ~3.5 in a CarRacing run.
    """
    per_shard = -(-run.chunks_per_update // run.replay_shards)
    return max(2, min(per_shard, replay_size(run)))


#: run_values' fields that are not copies of a run field of the same name: (service, field) -> run fields.
DERIVED_FROM: dict[tuple[str, str], frozenset[str]] = {
    ("replay", "max_size"): frozenset({"replay_max_size", "chunks_per_update"}),
    ("edge-encoder", "observation_store_size"): frozenset(
        {"replay_max_size", "chunks_per_update", "unroll_length", "num_envs"}
    ),
    ("environment", "max_steps"): frozenset({"steps"}),
    ("replay", "samples_per_insert"): frozenset({"train_every_step"}),
    ("replay", "error_buffer"): frozenset(
        {"train_every_step", "chunks_per_update", "replay_shards", "replay_max_size"}
    ),
    ("inference", "max_pending_inserts"): frozenset({"train_every_step", "num_envs"}),
    ("learner", "nice"): frozenset({"learner_nice"}),
    ("replay", "fsync"): frozenset({"replay_fsync"}),
}


def load_recipe(recipe: Path) -> RunSettings:
    """Run recipe `recipe` (the YAML file `splitrl up --config` takes) validated as a whole run, so a typo in any
    key fails here; its `model_fields_set` are the keys the file sets."""
    return validate_settings(RunSettings, load_config(recipe, RunSettings))


def recipe_share(recipe: Path, name: str) -> dict[str, Any]:
    """Service `name`'s share of run recipe `recipe` (the YAML file `splitrl up --config` takes), for a service
    started on its own (`splitrl serve NAME --config FILE`, compose, Kubernetes): the run_values that come from
    fields the recipe sets (load_recipe)."""
    run = load_recipe(recipe)
    return {
        field: value
        for field, value in run_values(run, name).items()
        if DERIVED_FROM.get((name, field), {field}) & run.model_fields_set
    }


def recipe_values(recipe: Path, model: type[BaseModel]) -> dict[str, Any]:
    """The values run recipe `recipe` sets for fields `model` has, for a command that takes a recipe's share
    as it is (`splitrl pretrain-encoder --config FILE`; load_recipe)."""
    run = load_recipe(recipe)
    return {field: getattr(run, field) for field in run.model_fields_set if field in model.model_fields}


def plan(
    run: RunSettings,
    run_dir: Path,
    addresses: Mapping[str, str] | None = None,
    *,
    hosts: Mapping[str, str] | None = None,
    done_steps: int = 0,
) -> dict[str, ServerSettings]:
    """Every instance's settings (see instance_names), in start order.

    `addresses`: host:port each serving instance is dialled at (a service none of whose replicas serves is
    NOT_SERVING). `hosts`: the address each instance binds to (127.0.0.1 unless given). `done_steps`: agent
    steps earlier segments of a resumed run took; the environment takes the rest, on tracks it has not played.
    Ports are 0 (the instance picks one and writes it to RUN_DIR/NAME.ports.json). ValueError names the
    instance whose settings fail.
    """
    if done_steps >= run.steps:
        raise ValueError(f"the run took {done_steps} of its {run.steps} steps already: nothing left to plan")
    addresses, hosts = addresses or {}, hosts or {}

    instances = instance_names(run)

    def address(of: str) -> str:
        """Where `of` is dialled: the address of each of its serving replicas, comma-separated."""
        serving = [addresses[name] for name in instances if service_of(name) == of and name in addresses]
        return ",".join(serving) or NOT_SERVING

    def learner_rank(learner: str) -> dict[str, Any]:
        """A data-parallel learner's place in the group; rank 0 alone checkpoints."""
        rank = instances.index(learner) - instances.index("learner")
        rendezvous = f"{hosts.get('learner', '127.0.0.1')}:{run.learner_rendezvous_port}"
        group = {"rank": rank, "world_size": run.learners, "rendezvous_endpoint": rendezvous}
        return group | ({} if rank == 0 else {"checkpoint_dir": None})

    def replay_data(replay: str) -> dict[str, Any]:
        """Each replay shard's own directory in the run's, unless the run keeps replay in memory."""
        return {"data_dir": run_dir_files.replay_data_dir(run_dir, replay) if run.replay_durable else None}

    def shard_of(inference: str) -> dict[str, Any]:
        """Inference replica r's index and the one replay shard it writes to (core.config.shard_index)."""
        replica = instances.index(inference) - instances.index("inference")
        shard = replica_name("replay", shard_index(replica, run.replay_shards))
        return {"replica_index": replica, "replay_address": addresses.get(shard, NOT_SERVING)}

    placement: dict[str, dict[str, Any]] = {
        "replay": {},
        "inference": {},  # its shard: per replica, below
        "learner": {
            "replay_address": address("replay"),
            "inference_address": address("inference"),
            "checkpoint_dir": run_dir_files.learner_checkpoint_dir(run_dir),
        },
        "edge-encoder": {
            "inference_address": address("inference"),
            "learner_address": addresses.get("learner", NOT_SERVING),  # rank 0: it relays the other ranks
            "checkpoint_dir": run_dir_files.edge_checkpoint_dir(run_dir),
        },
        "environment": {"encoder_address": address("edge-encoder")},
    }
    planned = {}
    for name in instances:
        service = service_of(name)
        values = {
            **run_values(run, service, done_steps),
            "host": hosts.get(name, "127.0.0.1"),
            "port": 0,
            "metrics_port": 0,
            "port_file": run_dir / f"{name}{PORT_FILE_SUFFIX}",
            "final_metrics_file": run_dir / "metrics" / f"{name}.prom",
            **tls_values(service, run, run_dir),
            **placement[service],
            **(shard_of(name) if service == "inference" else {}),
            **(replay_data(name) if service == "replay" else {}),
            **(learner_rank(name) if service == "learner" and run.learners > 1 else {}),
        }
        try:
            planned[name] = SERVICE_SETTINGS[service](**values)
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None
    return planned


def amended(settings: S, **values: Any) -> S:
    """`settings` with `values` changed, validated again (pydantic's model_copy does not validate)."""
    return type(settings).model_validate(settings.model_dump(exclude_unset=True) | values)


def prepare_tls(run: RunSettings, run_dir: Path) -> None:
    """A fresh CA and a certificate per service under RUN_DIR/tls/ (none under plaintext, which warns instead)."""
    if run.tls == "plaintext":
        print("splitrl: --tls plaintext: links are unencrypted and unauthenticated", file=sys.stderr)
        return
    certs.generate(run_dir / "tls", START_ORDER)


def tls_values(name: str, run: RunSettings, run_dir: Path) -> dict[str, Any]:
    """Service `name`'s transport settings: its own certificate from prepare_tls, and the run's CA."""
    if run.tls == "plaintext":
        return {"tls": "plaintext"}
    tls_dir = run_dir / "tls"
    return {
        "tls": run.tls,
        "tls_cert_file": tls_dir / f"{name}.pem",
        "tls_key_file": tls_dir / f"{name}-key.pem",
        "tls_ca_file": tls_dir / "ca.pem",
    }

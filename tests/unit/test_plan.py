"""A run is described once: `plan` builds every service's settings from one RunSettings, in the parent."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic import ValidationError

from splitrl.core.args import (
    add_config_argument,
    add_settings_arguments,
    load_config,
    settings_argv,
    settings_from_args,
    validate_settings,
)
from splitrl.core.config import split_addresses
from splitrl.edge_encoder.settings import EdgeEncoderSettings
from splitrl.learner.settings import LearnerSettings
from splitrl.run.plan import (
    NOT_SERVING,
    SERVICE_SETTINGS,
    START_ORDER,
    amended,
    instance_names,
    plan,
    recipe_share,
    service_of,
)
from splitrl.run.settings import SHARED_GROUPS, RunSettings

RUN = RunSettings(
    mode="split-accumulate",
    env="splitrl/Catch-v0",
    env_kwargs={"grid": 12},
    frame_size=36,
    width=32,
    bottleneck="layernorm",
    activation_codec="int4+zstd",
    seed=7,
    num_envs=8,
    env_groups=2,
    action_repeat=2,
    unroll_length=16,
    chunks_per_update=8,
    learning_rate=5e-4,
    encoder_learning_rate=1e-4,
    encoder_epochs=1,
    video_crf=28,
    steps=1000,
    tls="mtls",
)


def test_every_service_gets_the_runs_values_of_the_groups_it_shares(tmp_path):
    services = plan(RUN, tmp_path, {"replay": "127.0.0.1:5001", "inference": "127.0.0.1:5002"})
    assert list(services) == list(START_ORDER)
    for name in ("inference", "learner", "edge-encoder", "environment"):
        settings = services[name]
        assert (settings.width, settings.bottleneck, settings.env_kwargs) == (32, "layernorm", {"grid": 12})
        assert settings.tls_cert_file == tmp_path / "tls" / f"{name}.pem"
    learner, edge, inference = services["learner"], services["edge-encoder"], services["inference"]
    assert (learner.chunks_per_update, learner.learning_rate, learner.mode, learner.seed) == (8, 5e-4, RUN.mode, 7)
    assert (edge.activation_codec, edge.video_crf, edge.learner_address) == ("int4+zstd", 28, NOT_SERVING)
    assert (edge.encoder_learning_rate, learner.encoder_epochs) == (1e-4, 1)
    assert (inference.unroll_length, inference.replay_address) == (16, "127.0.0.1:5001")
    assert learner.inference_address == "127.0.0.1:5002"
    environment = services["environment"]
    assert (environment.num_envs, environment.env_groups, environment.action_repeat) == (8, 2, 2)
    assert (environment.seed, environment.max_steps) == (7, 1000)
    assert services["replay"].max_size == 2 * 8  # replay has no seed group: its draws stay unseeded
    assert services["replay"].seed is None
    # the edge keeps every step a chunk being filled (8 envs), in replay (16) or in training (8) may hold, twice
    assert edge.observation_store_size == 2 * 16 * (8 + 16 + 8)


def test_a_resumed_run_plans_the_steps_left_on_new_tracks(tmp_path):
    environment = plan(RUN, tmp_path, done_steps=400)["environment"]
    assert (environment.max_steps, environment.seed) == (600, 7 + 400)
    with pytest.raises(ValueError, match="took 1000 of its 1000 steps"):
        plan(RUN, tmp_path, done_steps=1000)


def test_training_every_step_makes_replay_hold_inserts_and_inference_wait_on_them(tmp_path):
    default = plan(RUN, tmp_path)
    assert default["replay"].rate_limiter().can_insert() and default["replay"].samples_per_insert is None
    planned = plan(RUN.model_copy(update={"train_every_step": True}), tmp_path)
    replay, inference = planned["replay"], planned["inference"]
    assert (replay.max_size, replay.samples_per_insert, replay.error_buffer) == (16, 1.0, 7.0)
    assert inference.max_pending_inserts == RUN.num_envs
    limiter = replay.rate_limiter()  # one update's chunks that nobody sampled take no more: nothing is evicted
    for _ in range(RUN.chunks_per_update):
        assert limiter.can_insert()
        limiter.insert()
    assert not limiter.can_insert()
    limiter.sample()
    limiter.delete()  # fifo: a sampled chunk leaves the table
    assert limiter.can_insert()
    sharded = plan(
        RUN.model_copy(update={"train_every_step": True, "inference_replicas": 2, "replay_shards": 2}), tmp_path
    )
    assert sharded["replay"].error_buffer == 3.0  # each shard holds back its share of an update


def test_a_field_the_run_and_a_service_both_have_comes_from_one_group():
    """Nothing of a service is declared a second time on the run (the drift that gave two defaults)."""
    grouped = {name for group in SHARED_GROUPS for name in group.model_fields}
    launcher_own = {"tls", "torch_threads"}  # the run's choice, turned into each service's files and threads
    for name, model in SERVICE_SETTINGS.items():
        twice = (set(RunSettings.model_fields) & set(model.model_fields)) - grouped - launcher_own
        assert not twice, f"{name} and RunSettings both declare {sorted(twice)}"


@pytest.mark.parametrize("name", START_ORDER)
def test_planned_settings_survive_the_trip_through_a_childs_flags(tmp_path, name):
    planned = plan(RUN, tmp_path, {"replay": "127.0.0.1:5001"})[name]
    model = SERVICE_SETTINGS[name]
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, model)
    parsed = settings_from_args(model, parser.parse_args(settings_argv(planned)), environ={})
    assert parsed.model_dump(exclude={"edge_id"}) == planned.model_dump(exclude={"edge_id"})


def test_amended_settings_are_validated_again(tmp_path):
    learner = plan(RUN, tmp_path)["learner"]
    assert amended(learner, checkpoint_every=1).checkpoint_every == 1
    with pytest.raises(ValidationError, match="checkpoint_every"):
        amended(learner, checkpoint_every=0)
    with pytest.raises(ValidationError, match="no_such_setting"):
        amended(learner, no_such_setting=1)


def test_the_run_checks_what_services_would_refuse_before_anything_starts():
    with pytest.raises(ValidationError, match="env_groups=4 exceeds num_envs=2"):
        RunSettings(num_envs=2, env_groups=4)


def test_a_video_shadow_is_for_split_runs_and_refused_in_cloud_mode_before_anything_starts(tmp_path: Path):
    cloud_with_shadow = RUN.model_copy(update={"mode": "cloud", "codec": "h264", "video_shadow": True})
    with pytest.raises(ValueError, match=r"(?s)edge-encoder: .*video_shadow=True counts what cloud mode's H\.264"):
        plan(cloud_with_shadow, tmp_path)
    with pytest.raises(ValidationError, match="in mode='cloud' run --codec h264 instead"):
        EdgeEncoderSettings(mode="cloud", video_shadow=True)
    planned = plan(RUN.model_copy(update={"mode": "split", "video_shadow": True}), tmp_path)
    assert planned["edge-encoder"].video_shadow is True  # type: ignore[attr-defined]


def test_port_files_and_final_metrics_land_in_the_run_directory(tmp_path: Path):
    for name, settings in plan(RUN, tmp_path).items():
        assert settings.port_file == tmp_path / f"{name}.ports.json"
        assert settings.final_metrics_file == tmp_path / "metrics" / f"{name}.prom"
        assert (settings.port, settings.metrics_port) == (0, 0)


RECIPE = Path(__file__).resolve().parents[2] / "configs" / "carracing.yaml"


@pytest.mark.parametrize("name", START_ORDER)
def test_a_service_started_from_a_recipe_agrees_with_what_up_plans_for_it(tmp_path, name):
    """`splitrl serve NAME --config RECIPE` (compose, Kubernetes) and `splitrl up --config RECIPE` give a
    service the same value for every field the recipe decides."""
    share = recipe_share(RECIPE, name)
    planned = plan(validate_settings(RunSettings, load_config(RECIPE, RunSettings)), tmp_path)[name]
    assert share, f"{name} takes nothing from {RECIPE.name}"
    assert {field: getattr(planned, field) for field in share} == share


def test_a_recipe_share_holds_only_what_the_recipe_sets():
    environment = recipe_share(RECIPE, "environment")
    assert (environment["env"], environment["action_repeat"], environment["max_steps"]) == ("CarRacing-v3", 4, 500_000)
    assert "seed" not in environment and "torch_threads" not in environment  # left to the service's defaults
    # chunks_per_update 16; train_every_step: each chunk sampled once, inserts wait past one update's chunks
    assert recipe_share(RECIPE, "replay") == {"max_size": 2 * 16, "samples_per_insert": 1.0, "error_buffer": 15.0}
    assert recipe_share(RECIPE, "edge-encoder")["observation_store_size"] == 2 * 32 * (8 + 32 + 16)
    learner = recipe_share(RECIPE, "learner")
    assert (learner["learning_rate"], learner["reward_scale"], learner["mode"]) == (2.5e-4, 0.1, "cloud")
    # the V-trace recipe: both rates annealed to 0 at the run's last step, clip 0.1
    assert (learner["correction"], learner["clip"]) == ("vtrace", 0.1)
    assert learner["lr_anneal_steps"] == learner["entropy_anneal_steps"] == environment["max_steps"]


def test_a_recipe_with_a_key_no_run_has_fails_naming_it(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("env: CarRacing-v3\nlearning_rat: 0.001\n")
    with pytest.raises(ValueError, match="unknown settings 'learning_rat'"):
        recipe_share(recipe, "learner")
    recipe.write_text("width: 0\n")
    with pytest.raises(ValueError, match="--width / SPLITRL_WIDTH"):
        recipe_share(recipe, "edge-encoder")


def test_serve_takes_flags_then_non_empty_variables_then_the_recipe(tmp_path):
    """Compose writes `${SPLITRL_WIDTH:-}` as an empty variable: that must leave the recipe's value."""
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, EdgeEncoderSettings)
    add_config_argument(parser)
    environ = {"SPLITRL_CONFIG": str(RECIPE), "SPLITRL_WIDTH": "", "SPLITRL_FRAME_STACK": "2"}

    def share(path: Path, _model: object) -> dict:
        return recipe_share(path, "edge-encoder")

    edge = settings_from_args(EdgeEncoderSettings, parser.parse_args(["--codec", "frame"]), environ, share)
    assert (edge.width, edge.frame_stack, edge.codec, edge.mode) == (4096, 2, "frame", "cloud")


def test_inference_replicas_are_instances_that_every_dialler_lists(tmp_path: Path):
    run = RUN.model_copy(update={"inference_replicas": 3})
    names = instance_names(run)
    assert names == ["replay", "inference", "inference-1", "inference-2", "learner", "edge-encoder", "environment"]
    assert [service_of(name) for name in names] == [
        "replay", "inference", "inference", "inference", "learner", "edge-encoder", "environment"
    ]  # fmt: skip
    serving = {"replay": "127.0.0.1:5001", "inference": "127.0.0.1:5002", "inference-2": "127.0.0.1:5004"}
    planned = plan(run, tmp_path, serving)
    assert list(planned) == names
    # Peers dial every replica that serves, in instance order; each replica has its own files and the
    # service's certificate.
    assert (
        planned["learner"].inference_address
        == planned["edge-encoder"].inference_address
        == ("127.0.0.1:5002,127.0.0.1:5004")
    )
    replica = planned["inference-2"]
    assert isinstance(replica, SERVICE_SETTINGS["inference"])
    assert replica.port_file == tmp_path / "inference-2.ports.json"
    assert replica.final_metrics_file == tmp_path / "metrics" / "inference-2.prom"
    assert replica.tls_cert_file == tmp_path / "tls" / "inference.pem"
    assert replica.replay_address == "127.0.0.1:5001"
    assert plan(run, tmp_path)["learner"].inference_address == NOT_SERVING  # none serves yet


@pytest.mark.parametrize(
    "addresses, expected",
    [
        ("inference:50052", ["inference:50052"]),
        ("10.0.0.1:50052, 10.0.0.2:50052", ["10.0.0.1:50052", "10.0.0.2:50052"]),
        ("[::1]:50052,localhost:1", ["[::1]:50052", "localhost:1"]),
    ],
)
def test_an_address_list_is_host_port_entries_in_order(addresses, expected):
    assert split_addresses(addresses) == expected
    assert EdgeEncoderSettings(inference_address=addresses).inference_address == ",".join(expected)


@pytest.mark.parametrize(
    "addresses, message",
    [
        ("inference", "expected host:port .* got 'inference'"),
        ("a:1,", "got '' in 'a:1,'"),
        (":50052", "got ':50052'"),
        ("a:http", "got 'a:http'"),
        ("a:70000", "got 'a:70000'"),
        ("a:1,b:2,a:1", "a:1 listed more than once"),
    ],
)
def test_a_bad_address_list_is_refused_quoting_the_entry(addresses, message):
    with pytest.raises(ValueError, match=message):
        split_addresses(addresses)
    with pytest.raises(ValidationError, match="inference_address"):
        LearnerSettings(inference_address=addresses)


def test_replicas_are_bounded():
    with pytest.raises(ValidationError, match="inference_replicas"):
        RunSettings(inference_replicas=0)


def test_replay_shards_are_instances_each_written_by_its_inference_replicas(tmp_path: Path):
    run = RUN.model_copy(update={"inference_replicas": 3, "replay_shards": 2})
    names = instance_names(run)
    assert names[:5] == ["replay", "replay-1", "inference", "inference-1", "inference-2"]
    serving = {"replay": "127.0.0.1:5001", "replay-1": "127.0.0.1:5002"}
    planned = plan(run, tmp_path, serving)
    # Replica r writes to shard r mod 2; the learner samples both.
    shards = [planned[name].replay_address for name in ("inference", "inference-1", "inference-2")]
    assert shards == ["127.0.0.1:5001", "127.0.0.1:5002", "127.0.0.1:5001"]
    assert [planned[name].replica_index for name in ("inference", "inference-1", "inference-2")] == [0, 1, 2]
    assert planned["learner"].replay_address == "127.0.0.1:5001,127.0.0.1:5002"
    assert planned["replay-1"].port_file == tmp_path / "replay-1.ports.json"
    assert planned["replay-1"].max_size == planned["replay"].max_size == 2 * 8


def test_replay_under_a_run_is_durable_in_the_run_directory_unless_told_otherwise(tmp_path: Path):
    run = RUN.model_copy(update={"inference_replicas": 2, "replay_shards": 2})
    planned = plan(run, tmp_path)
    assert planned["replay"].data_dir == tmp_path / "replay" / "replay"
    assert planned["replay-1"].data_dir == tmp_path / "replay" / "replay-1"  # each shard its own log
    assert planned["replay"].fsync == "always"
    fast = plan(run.model_copy(update={"replay_fsync": "never"}), tmp_path)
    assert fast["replay"].fsync == "never"
    assert plan(run.model_copy(update={"replay_durable": False}), tmp_path)["replay"].data_dir is None


def test_an_inference_given_every_shard_writes_to_its_index_mod_their_count():
    """What a Kubernetes or compose replica does: every shard listed, its own index (the pod's) picks one, by the
    same rule `splitrl up` plans with."""
    shards = "replay-0.replay:50053,replay-1.replay:50053"
    picked = [
        SERVICE_SETTINGS["inference"](replay_address=shards, replica_index=index).replay_shard_address
        for index in range(4)
    ]
    assert picked == ["replay-0.replay:50053", "replay-1.replay:50053"] * 2
    assert SERVICE_SETTINGS["inference"](replica_index=3).replay_shard_address == "127.0.0.1:50053"  # one replay
    with pytest.raises(ValidationError, match="replay_address"):
        SERVICE_SETTINGS["inference"](replay_address="replay:50053,replay:50053")


def test_a_shard_no_inference_writes_to_is_refused():
    with pytest.raises(ValidationError, match="replay_shards=2 exceeds inference_replicas=1"):
        RunSettings(replay_shards=2)


@pytest.mark.parametrize("mode", ["cloud", "split-accumulate"])
def test_data_parallel_learners_are_ranks_that_meet_at_rank_0(tmp_path: Path, mode: str):
    run = RUN.model_copy(update={"mode": mode, "learners": 2, "learner_rendezvous_port": 29999})
    names = instance_names(run)
    assert names[names.index("learner") : names.index("learner") + 2] == ["learner", "learner-1"]
    planned = plan(run, tmp_path, {"learner": "127.0.0.1:5003", "learner-1": "127.0.0.1:5004"})
    ranks = [planned[name] for name in ("learner", "learner-1")]
    assert [(r.rank, r.world_size, r.rendezvous_endpoint) for r in ranks] == [
        (0, 2, "127.0.0.1:29999"),
        (1, 2, "127.0.0.1:29999"),
    ]
    assert (ranks[0].checkpoint_dir, ranks[1].checkpoint_dir) == (tmp_path / "checkpoints", None)  # rank 0 saves
    assert planned["edge-encoder"].learner_address == "127.0.0.1:5003"  # split modes: edges dial rank 0 only
    assert plan(RUN, tmp_path)["learner"].world_size == 1  # one learner: no group


@pytest.mark.parametrize(
    "values, message",
    [
        ({"learners": 3, "mode": "cloud", "chunks_per_update": 8}, "chunks_per_update=8 must divide among learners=3"),
    ],
)
def test_learners_that_cannot_train_together_are_refused_before_anything_starts(values, message):
    with pytest.raises(ValidationError, match=message):
        RunSettings(**values)

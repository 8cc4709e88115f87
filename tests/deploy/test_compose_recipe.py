"""docker-compose.yml takes a run recipe: every service gets its share of SPLITRL_CONFIG, and the shell's
SPLITRL_* variables override it. Checked offline, on what `docker compose config` renders (no engine)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import TypeAdapter

from splitrl.core.args import CONFIG_DEST, load_config, settings_from_args, validate_settings
from splitrl.core.config import split_addresses
from splitrl.run.plan import SERVICE_SETTINGS, instance_names, plan, recipe_share, service_of
from splitrl.run.settings import RunSettings
from tests.deploy.conftest import REPO, promtool, tool

RUN_LEVEL = ("env", "frame_size", "width", "bottleneck", "mode", "codec", "activation_codec")


def rendered(tmp_path: Path, shell: dict[str, str], files: tuple[str, ...] = ()) -> dict[str, Any]:
    """The compose file (with `files` layered over it) as Compose resolves it for a shell that sets `shell` (and
    no other SPLITRL_*)."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith("SPLITRL_")}
    environ |= {"SPLITRL_TLS_DIR": str(tmp_path)} | shell
    layers = [arg for file in ("docker-compose.yml", *files) if files for arg in ("-f", str(REPO / file))]
    result = subprocess.run(
        [tool("docker"), "compose", "--project-directory", str(REPO), *layers, "config", "--format", "json"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def container_environment(compose: dict[str, Any], name: str) -> dict[str, str]:
    """Container NAME's variables, SPLITRL_CONFIG pointing at the host's copy of the recipe Compose mounts."""
    service = compose["services"][name]
    (mount,) = [m for m in service["configs"] if m["target"] == service["environment"]["SPLITRL_CONFIG"]]
    recipe = Path(compose["configs"][mount["source"]]["file"])
    return dict(service["environment"]) | {"SPLITRL_CONFIG": str(recipe)}


def service_settings(compose: dict[str, Any], name: str) -> Any:
    """What `splitrl serve SERVICE` builds inside container NAME (an instance: `inference-1` serves inference):
    its variables, and the recipe Compose mounts."""
    environ, name = container_environment(compose, name), service_of(name)

    def share(path: Path, _model: object) -> dict[str, Any]:
        return recipe_share(path, name)

    return settings_from_args(SERVICE_SETTINGS[name], argparse.Namespace(**{CONFIG_DEST: None}), environ, share)


@pytest.mark.parametrize("recipe", ["configs/catch.yaml", "configs/carracing.yaml"])
def test_every_service_agrees_with_what_up_plans_for_the_same_recipe(tmp_path, recipe):
    compose = rendered(tmp_path, {} if recipe == "configs/catch.yaml" else {"SPLITRL_CONFIG": recipe})
    run = validate_settings(RunSettings, load_config(REPO / recipe, RunSettings))
    planned = plan(run, tmp_path)
    for name in SERVICE_SETTINGS:
        settings = service_settings(compose, name)
        decided = recipe_share(REPO / recipe, name)
        assert {field: getattr(settings, field) for field in decided} == {
            field: getattr(planned[name], field) for field in decided
        }, name


def test_a_variable_set_in_the_shell_overrides_the_recipe_in_every_service(tmp_path):
    shell = {"SPLITRL_CONFIG": "configs/carracing.yaml", "SPLITRL_MODE": "split-accumulate", "SPLITRL_WIDTH": "32"}
    compose = rendered(tmp_path, shell)
    for name in ("inference", "learner", "edge-encoder", "environment"):
        settings = service_settings(compose, name)
        assert (settings.width, settings.env, settings.frame_stack) == (32, "CarRacing-v3", 4), name
    for name in ("inference", "learner", "edge-encoder"):  # the environment has no mode
        assert service_settings(compose, name).mode == "split-accumulate", name
    assert service_settings(compose, "environment").max_steps == 500_000  # the recipe's steps


def test_the_run_level_variables_are_left_to_the_recipe_unless_the_shell_sets_them(tmp_path):
    """An empty variable is unset (core/args): a default written in compose would hide the recipe's value."""
    compose = rendered(tmp_path, {})
    for name in ("inference", "learner", "edge-encoder", "environment"):
        environ = compose["services"][name]["environment"]
        for field in RUN_LEVEL:
            assert environ.get(f"SPLITRL_{field.upper()}", "") == "", (name, field)


COMPOSE_GUIDE = REPO / "docs" / "how-to" / "compose.md"
SCALE_OUT_GUIDE = REPO / "docs" / "how-to" / "scale-out.md"


def readme_compose_commands(subcommand: str = "up") -> list[str]:
    """The compose guide's `VAR=value ... docker compose SUBCOMMAND` lines (bash blocks)."""
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", COMPOSE_GUIDE.read_text(), re.S))
    return [
        line.split("  #")[0].strip()
        for line in blocks.splitlines()
        if re.match(rf"SPLITRL_\w+=.*docker compose {subcommand} ", line + " ")
    ]


def shell_of(command: str) -> dict[str, str]:
    """The `VAR=value` words before `docker compose`."""
    return dict(word.split("=", 1) for word in command.split(" docker compose")[0].split())


def test_readmes_compose_commands_set_what_they_say(tmp_path):
    commands = readme_compose_commands()
    assert len(commands) >= 2, "the compose guide shows how to run a recipe under compose"
    for command in commands:
        shell = shell_of(command)
        compose = rendered(tmp_path, shell)
        recipe = validate_settings(RunSettings, load_config(REPO / shell.pop("SPLITRL_CONFIG"), RunSettings))
        for name in ("inference", "learner", "edge-encoder", "environment"):
            settings = service_settings(compose, name)
            assert settings.env == recipe.env, (command, name)
            for variable, value in shell.items():
                field = variable.removeprefix("SPLITRL_").lower()
                if field in type(settings).model_fields:
                    typed = TypeAdapter(type(settings).model_fields[field].annotation).validate_python(value)
                    assert getattr(settings, field) == typed, (command, name, field)


def test_readmes_pretrain_command_writes_the_file_its_up_command_starts_the_edge_from(tmp_path):
    """The compose guide's one-off `docker compose run ... edge-encoder pretrain-encoder`: its settings are the
    recipe's and the shell's, as the serving edge-encoder's are; it writes into the edge's checkpoint volume, the
    file that the guide's split-accumulate `up` hands the edge."""
    from splitrl.cli.main import build_parser
    from splitrl.run.plan import recipe_values
    from splitrl.run.settings import PretrainSettings

    (command,) = readme_compose_commands("run")
    shell = shell_of(command)
    compose = rendered(tmp_path, shell)
    words = command.split(" docker compose run ")[1].split()
    assert words[:3] == ["--rm", "--no-deps", "edge-encoder"], "no peers started, the edge's image and volume"
    args = build_parser().parse_args(words[3:])
    environ = container_environment(compose, "edge-encoder")  # what the one-off container is given
    pretrained = settings_from_args(PretrainSettings, args, environ, read_config=recipe_values)
    serving = service_settings(compose, "edge-encoder")
    assert (pretrained.env, pretrained.frame_size, pretrained.frame_stack) == (
        serving.env,
        serving.frame_size,
        serving.frame_stack,
    )
    assert (str(pretrained.width), pretrained.bottleneck) == (shell["SPLITRL_WIDTH"], shell["SPLITRL_BOTTLENECK"])
    mounts = compose["services"]["edge-encoder"]["volumes"]
    volumes = [Path(volume["target"]) for volume in mounts if volume["type"] == "volume"]
    assert any(pretrained.out.is_relative_to(volume) for volume in volumes), (pretrained.out, volumes)

    ups = [up for up in readme_compose_commands() if "SPLITRL_ENCODER_INIT" in up]
    assert ups, "the compose guide runs the pretrained encoder under compose"
    for up in ups:
        assert shell_of(up)["SPLITRL_CONFIG"] == shell["SPLITRL_CONFIG"], "the same recipe pretrains and runs"
        assert Path(shell_of(up)["SPLITRL_ENCODER_INIT"]) == pretrained.out
        settings = service_settings(rendered(tmp_path, shell_of(up)), "edge-encoder")
        fitted = ("env", "frame_size", "frame_stack", "width", "bottleneck")  # what load_pretrained checks
        assert [getattr(settings, name) for name in fitted] == [getattr(pretrained, name) for name in fitted]
        assert settings.encoder_init == pretrained.out


SCALE_OUT = "docker-compose.scale-out.yml"


def test_the_scale_out_file_runs_the_instances_up_plans_for_replicas_shards_and_ranks(tmp_path):
    """docker-compose.scale-out.yml over the base file is `splitrl up --inference-replicas 2 --replay-shards 2
    --learners 2` with compose's service names for addresses: the same instances, each dialling the same peers
    (inference-1 writing to replay-1, the ranks meeting at rank 0, edges dialling rank 0 for training)."""
    compose = rendered(tmp_path, {}, (SCALE_OUT,))
    recipe = load_config(REPO / "configs/catch.yaml", RunSettings)
    run = validate_settings(RunSettings, recipe | {"inference_replicas": 2, "replay_shards": 2, "learners": 2})
    instances = instance_names(run)
    ports = {"replay": 50053, "inference": 50052, "learner": 50054, "edge-encoder": 50051, "environment": 50050}
    addresses = {name: f"{name}:{ports[service_of(name)]}" for name in instances}
    planned = plan(run, tmp_path, addresses, hosts={"learner": "learner"})
    assert set(instances) <= set(compose["services"])
    for name in instances:
        settings, expected = service_settings(compose, name), planned[name]
        for field in ("inference_address", "learner_address", "encoder_address", "rank", "world_size"):
            if field in type(settings).model_fields:
                assert getattr(settings, field) == getattr(expected, field), (name, field)
        if service_of(name) == "inference":
            assert settings.replica_index == expected.replica_index, name
            assert settings.replay_shard_address == expected.replay_shard_address, name
        if service_of(name) == "learner":
            assert settings.replay_address == expected.replay_address, name
            assert settings.rendezvous_endpoint == expected.rendezvous_endpoint == "learner:29500"
    # The certificates the file's and the scale-out guide's commands make name every added instance (they serve
    # under their service's certificate).
    added = sorted(name for name in compose["services"] if name not in rendered(tmp_path, {})["services"])
    for text in ((REPO / SCALE_OUT).read_text(), SCALE_OUT_GUIDE.read_text()):
        [names] = re.findall(r"splitrl certs --out deploy/tls --names (\S+)", text)
        assert sorted(names.split(",")) == added
    # Every instance keeps its own state; peers share a network with what they dial.
    volumes = {name: [v["source"] for v in compose["services"][name].get("volumes", [])] for name in instances}
    assert volumes["replay"] != volumes["replay-1"] and volumes["learner"] != volumes["learner-1"]
    for name in instances:
        networks = set(compose["services"][name]["networks"])
        for variable, value in compose["services"][name]["environment"].items():
            if variable.endswith("_ADDRESS") or variable == "SPLITRL_RENDEZVOUS_ENDPOINT":
                for entry in split_addresses(value):
                    dialled = entry.rsplit(":", 1)[0]
                    assert networks & set(compose["services"][dialled]["networks"]), (name, variable, entry)


def test_prometheus_scrapes_the_scale_out_instances_under_their_services_jobs(tmp_path):
    """The targets file docker-compose.scale-out.yml mounts lists exactly the instances it adds, each with the
    labels its service's own job gives; promtool accepts the config with it in place."""
    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    labels = {
        job["job_name"]: job["static_configs"][0]["labels"] | {"job": job["job_name"]}
        for job in config["scrape_configs"]
        if job["job_name"] in SERVICE_SETTINGS
    }
    groups = yaml.safe_load((REPO / "deploy/prometheus/scale-out/replicas.yml").read_text())
    targets = {target: group["labels"] for group in groups for target in group["targets"]}
    compose = yaml.safe_load((REPO / SCALE_OUT).read_text())
    added = {name for name in compose["services"] if "extends" in compose["services"][name]}
    assert set(targets) == {f"{name}:9400" for name in added}
    for target, target_labels in targets.items():
        assert target_labels == labels[service_of(target.split(":")[0])], target
    [mount] = compose["services"]["prometheus"]["volumes"]
    assert mount == "./deploy/prometheus/scale-out:/etc/prometheus/targets:ro"
    [replicas_job] = [job for job in config["scrape_configs"] if job["job_name"] == "replicas"]
    assert replicas_job["file_sd_configs"] == [{"files": ["targets/*.yml"]}]
    # As mounted: the targets file where the config looks, promtool checking both (no "does not exist" warning).
    mounted = tmp_path / "prometheus"
    shutil.copytree(REPO / "deploy/prometheus", mounted)
    shutil.copy(REPO / "deploy/prometheus/scale-out/replicas.yml", mounted / "targets" / "replicas.yml")
    result = promtool("check", "config", str(mounted / "prometheus.yml"))
    assert result.returncode == 0 and "WARNING" not in result.stdout + result.stderr, result.stdout + result.stderr

"""docker-compose.yml takes a run recipe: every service gets its share of SPLITRL_CONFIG, and the shell's
SPLITRL_* variables override it. Checked offline, on what `docker compose config` renders (no engine)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from splitrl.core.args import CONFIG_DEST, load_config, settings_from_args, validate_settings
from splitrl.run.plan import SERVICE_SETTINGS, plan, recipe_share
from splitrl.run.settings import RunSettings
from tests.deploy.conftest import REPO, tool

RUN_LEVEL = ("env", "frame_size", "width", "bottleneck", "mode", "codec", "activation_codec")


def rendered(tmp_path: Path, shell: dict[str, str]) -> dict[str, Any]:
    """The compose file as Compose resolves it for a shell that sets `shell` (and no other SPLITRL_*)."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith("SPLITRL_")}
    environ |= {"SPLITRL_TLS_DIR": str(tmp_path)} | shell
    result = subprocess.run(
        [tool("docker"), "compose", "--project-directory", str(REPO), "config", "--format", "json"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def service_settings(compose: dict[str, Any], name: str) -> Any:
    """What `splitrl serve NAME` builds inside its container: its variables, and the recipe Compose mounts."""
    service = compose["services"][name]
    (mount,) = service["configs"]
    recipe = Path(compose["configs"][mount["source"]]["file"])
    environ = service["environment"]
    assert environ["SPLITRL_CONFIG"] == mount["target"]
    environ = environ | {"SPLITRL_CONFIG": str(recipe)}  # the host's copy of the mounted file

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
    assert service_settings(compose, "environment").max_steps == 750_000  # the recipe's steps


def test_the_run_level_variables_are_left_to_the_recipe_unless_the_shell_sets_them(tmp_path):
    """An empty variable is unset (core/args): a default written in compose would hide the recipe's value."""
    compose = rendered(tmp_path, {})
    for name in ("inference", "learner", "edge-encoder", "environment"):
        environ = compose["services"][name]["environment"]
        for field in RUN_LEVEL:
            assert environ.get(f"SPLITRL_{field.upper()}", "") == "", (name, field)


def readme_compose_commands() -> list[str]:
    """README's `VAR=value ... docker compose up` lines (bash blocks)."""
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S))
    return [
        line.split("  #")[0].strip()
        for line in blocks.splitlines()
        if re.match(r"SPLITRL_\w+=.*docker compose up", line)
    ]


def test_readmes_compose_commands_set_what_they_say(tmp_path):
    commands = readme_compose_commands()
    assert len(commands) >= 2, "README shows how to run a recipe under compose"
    for command in commands:
        shell = dict(word.split("=", 1) for word in command.split(" docker compose")[0].split())
        compose = rendered(tmp_path, shell)
        recipe = validate_settings(RunSettings, load_config(REPO / shell.pop("SPLITRL_CONFIG"), RunSettings))
        for name in ("inference", "learner", "edge-encoder", "environment"):
            settings = service_settings(compose, name)
            assert settings.env == recipe.env, (command, name)
            for variable, value in shell.items():
                field = variable.removeprefix("SPLITRL_").lower()
                if field in type(settings).model_fields:
                    assert str(getattr(settings, field)) == value, (command, name, field)

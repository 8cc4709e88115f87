"""splitrl.core.args: flag > SPLITRL_* variable > default, with the model's validation in the message."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import Field

from splitrl.cli.main import build_parser
from splitrl.core.args import add_settings_arguments, env_name, flag_name, settings_from_args
from splitrl.core.config import Settings
from splitrl.environment.settings import EnvironmentSettings
from splitrl.run.plan import recipe_share


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


def environment_settings(parser, *flags: str, environ: dict[str, str] | None = None) -> EnvironmentSettings:
    namespace = parser.parse_args(["serve", "environment", *flags])
    return settings_from_args(EnvironmentSettings, namespace, environ={} if environ is None else environ)


def test_names_of_flags_and_variables():
    assert flag_name("num_envs") == "--num-envs"
    assert env_name("num_envs") == "SPLITRL_NUM_ENVS"


def test_defaults_apply_without_flag_or_variable(parser):
    settings = environment_settings(parser)
    assert settings == EnvironmentSettings()
    assert settings.num_envs == 4
    assert settings.env_kwargs == {}


def test_variable_beats_default(parser):
    settings = environment_settings(parser, environ={"SPLITRL_NUM_ENVS": "3", "SPLITRL_ENV": "splitrl/Catch-v0"})
    assert settings.num_envs == 3
    assert settings.env == "splitrl/Catch-v0"


def test_flag_beats_variable(parser):
    settings = environment_settings(parser, "--num-envs", "8", environ={"SPLITRL_NUM_ENVS": "3"})
    assert settings.num_envs == 8


def test_unrelated_variables_are_ignored(parser):
    settings = environment_settings(parser, environ={"SPLITRL_NOT_A_FIELD": "x", "NUM_ENVS": "9"})
    assert settings.num_envs == 4


def test_values_are_converted_to_field_types(parser):
    settings = environment_settings(
        parser, "--shutdown-grace-s", "0.5", "--port-file", "/tmp/ports.json", environ={"SPLITRL_SEED": "12"}
    )
    assert settings.shutdown_grace_s == 0.5
    assert settings.port_file == Path("/tmp/ports.json")
    assert settings.seed == 12


def test_env_kwargs_json_parses_to_a_dict(parser):
    settings = environment_settings(parser, "--env-kwargs", '{"continuous": true, "grid": 6}')
    assert settings.env_kwargs == {"continuous": True, "grid": 6}


def test_env_kwargs_from_the_environment(parser):
    settings = environment_settings(parser, environ={"SPLITRL_ENV_KWARGS": '{"grid": 8}'})
    assert settings.env_kwargs == {"grid": 8}


def test_env_kwargs_bad_json_is_a_clear_error(parser):
    with pytest.raises(ValueError, match=r"--env-kwargs / SPLITRL_ENV_KWARGS: .*must be a JSON object.*\{oops"):
        environment_settings(parser, "--env-kwargs", "{oops")


def test_env_kwargs_must_be_an_object(parser):
    with pytest.raises(ValueError, match="--env-kwargs"):
        environment_settings(parser, "--env-kwargs", "[1, 2]")


def test_bad_value_names_the_flag_and_the_value(parser):
    with pytest.raises(ValueError) as excinfo:
        environment_settings(parser, "--num-envs", "0")
    message = str(excinfo.value)
    assert "--num-envs" in message
    assert "SPLITRL_NUM_ENVS" in message
    assert "'0'" in message
    assert "greater than or equal to 1" in message


def test_bad_variable_value_names_the_variable(parser):
    with pytest.raises(ValueError, match=r"SPLITRL_NUM_ENVS: .*\(got 'many'\)"):
        environment_settings(parser, environ={"SPLITRL_NUM_ENVS": "many"})


def test_every_bad_field_is_reported(parser):
    with pytest.raises(ValueError) as excinfo:
        environment_settings(parser, "--num-envs", "0", "--action-repeat", "99")
    assert "--num-envs" in str(excinfo.value)
    assert "--action-repeat" in str(excinfo.value)


def test_literal_flag_rejects_an_unknown_choice(parser, capsys):
    with pytest.raises(SystemExit) as excinfo:
        parser.parse_args(["serve", "environment", "--log-level", "loud"])
    assert excinfo.value.code == 2
    assert "invalid choice: 'loud'" in capsys.readouterr().err


def test_literal_variable_rejects_an_unknown_choice(parser):
    with pytest.raises(ValueError, match=r"--log-level / SPLITRL_LOG_LEVEL: .*'debug'.*\(got 'loud'\)"):
        environment_settings(parser, environ={"SPLITRL_LOG_LEVEL": "loud"})
    assert environment_settings(parser, "--log-level", "debug").log_level == "debug"


def test_help_lists_each_variable_and_default(parser, capsys):
    with pytest.raises(SystemExit) as excinfo:
        parser.parse_args(["serve", "environment", "--help"])
    assert excinfo.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--num-envs NUM_ENVS" in text
    assert "[env SPLITRL_NUM_ENVS; default: 4]" in text
    assert "SPLITRL_ENV_KWARGS; default: {}" in text


class Toggles(Settings):
    verbose: bool = Field(False, description="Say more.")
    dry_run: bool | None = Field(None, description="Do nothing.")
    level: int = Field(1, ge=0)


def toggles(*flags: str, environ: dict[str, str] | None = None) -> Toggles:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, Toggles)
    return settings_from_args(Toggles, parser.parse_args(list(flags)), environ=environ or {})


def test_bool_flags_take_no_value_and_have_a_negative_form():
    assert toggles().verbose is False
    assert toggles("--verbose").verbose is True
    assert toggles("--no-verbose", environ={"SPLITRL_VERBOSE": "true"}).verbose is False
    assert toggles("--dry-run").dry_run is True
    assert toggles().dry_run is None


def test_bool_variables_are_parsed():
    assert toggles(environ={"SPLITRL_VERBOSE": "true", "SPLITRL_DRY_RUN": "0"}).model_dump() == {
        "verbose": True,
        "dry_run": False,
        "level": 1,
    }
    with pytest.raises(ValueError, match=r"SPLITRL_VERBOSE: .*\(got 'perhaps'\)"):
        toggles(environ={"SPLITRL_VERBOSE": "perhaps"})


def test_bool_flag_help_shows_both_forms():
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, Toggles)
    text = " ".join(parser.format_help().split())
    assert "--verbose, --no-verbose" in text
    assert "[env SPLITRL_VERBOSE; default: False]" in text


class Percent(Settings):
    share: float = Field(0.5, description="Share of the steps, e.g. 50% (argparse %-formats help).")
    label: str = Field("100%", description="A default with a % in it.")


def test_a_percent_sign_in_a_description_or_default_shows_as_it_is():
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, Percent)
    text = " ".join(parser.format_help().split())
    assert "e.g. 50% (argparse %-formats help)." in text and "default: '100%'" in text


def test_every_commands_help_renders(parser):
    """Every command's --help, each service's included (a stray % in any description fails it)."""
    subcommands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    for command in subcommands[0].choices.values():
        command.format_help()
        for nested in [a for a in command._actions if isinstance(a, argparse._SubParsersAction)]:
            for inner in nested.choices.values():
                inner.format_help()


def test_to_argv_round_trips_booleans_as_flag_and_no_flag():
    from splitrl.core.args import to_argv
    from splitrl.edge_encoder.settings import EdgeEncoderSettings

    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, EdgeEncoderSettings)
    for measure in (True, False):
        argv = to_argv({"video_measure_psnr": measure, "video_crf": 28})
        settings = settings_from_args(EdgeEncoderSettings, parser.parse_args(argv), environ={})
        assert (settings.video_measure_psnr, settings.video_crf) == (measure, 28)


# --- --config FILE ---------------------------------------------------------------------------------


def up_settings(parser, *flags: str, environ: dict[str, str] | None = None):
    from splitrl.run.settings import RunSettings

    namespace = parser.parse_args(["up", *flags])
    return settings_from_args(RunSettings, namespace, environ={} if environ is None else environ)


def test_config_file_sets_values_and_flags_and_variables_override_it(parser, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("env: CarRacing-v3\nenv-kwargs: {continuous: false}\naction_repeat: 4\nlearning_rate: 1.0e-4\n")
    settings = up_settings(parser, "--config", str(config), "--action-repeat", "2", environ={"SPLITRL_SEED": "3"})
    assert settings.env_kwargs == {"continuous": False}
    assert settings.learning_rate == 1e-4
    assert settings.action_repeat == 2  # the flag beats the file
    assert settings.seed == 3
    assert up_settings(parser, "--config", str(config), environ={"SPLITRL_ACTION_REPEAT": "8"}).action_repeat == 8


def test_config_file_can_come_from_the_environment(parser, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("steps: 123\n")
    assert up_settings(parser, environ={"SPLITRL_CONFIG": str(config)}).steps == 123


def test_a_service_reads_the_config_variable_as_a_run_recipe_and_takes_its_share(parser, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("steps: 123\nwidth: 64\nlearning_rate: 0.1\n")  # the environment takes the first two
    namespace = parser.parse_args(["serve", "environment"])

    def share(path: Path, _model: object) -> dict:
        return recipe_share(path, "environment")

    settings = settings_from_args(EnvironmentSettings, namespace, {"SPLITRL_CONFIG": str(config)}, share)
    assert settings == EnvironmentSettings(max_steps=123, width=64)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stepz: 5\n", "unknown settings 'stepz'"),
        ("- 1\n- 2\n", "expected a mapping of settings, got list"),
        ("steps: [unclosed\n", "config"),
        ("steps: -4\n", "--steps / SPLITRL_STEPS"),
    ],
)
def test_bad_config_files_fail_with_the_reason(parser, tmp_path, text, message):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(ValueError) as error:
        up_settings(parser, "--config", str(config))
    assert message in str(error.value)


def test_a_missing_config_file_is_named(parser, tmp_path):
    with pytest.raises(ValueError, match=r"nope\.yaml"):
        up_settings(parser, "--config", str(tmp_path / "nope.yaml"))


def test_the_shipped_configs_are_valid(parser):
    """configs/, and the recipes the learning results were run from, stay valid as settings change."""
    root = Path(__file__).parents[2]
    configs = sorted((root / "configs").glob("*.yaml"))
    assert configs, "configs/ holds the per-env recipes"
    documented = sorted((root / "docs" / "results" / "data" / "learning").rglob("recipe.yaml"))
    assert len(documented) >= 5, "the learning results' reports each keep the recipe they ran"
    for config in configs + documented:
        up_settings(parser, "--config", str(config))


def test_a_rule_across_fields_is_reported_in_its_own_words(parser):
    """A model validator's error names no single field: its message is the report (not an IndexError)."""
    with pytest.raises(ValueError, match=r"steps=1000 goes past lr_anneal_steps=500: the learning rate is 0"):
        up_settings(parser, "--steps", "1000", "--lr-anneal-steps", "500")
    with pytest.raises(ValueError, match=r"invalid settings:\n  chunks_per_update=3 must divide among learners=2$"):
        up_settings(parser, "--chunks-per-update", "3", "--learners", "2")
    assert up_settings(parser, "--steps", "500", "--lr-anneal-steps", "500").steps == 500
    assert up_settings(parser, "--steps", "1000", "--entropy-anneal-steps", "500").steps == 1000  # a bonus may end


SERVICE_PACKAGES = {"replay", "inference", "learner", "edge_encoder", "environment"}


@pytest.mark.parametrize("service", ["environment", "edge-encoder", "inference", "replay", "learner"])
def test_serving_one_service_imports_only_its_own_settings(service):
    # In a fresh interpreter: what `splitrl serve NAME` parses with, and nothing of the run's other services.
    code = (
        "import sys; from splitrl.cli.main import build_parser; "
        f"build_parser({service!r}).parse_args(['serve', {service!r}, '--port', '0']); "
        "print(' '.join(sorted(sys.modules)))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    loaded = set(run.stdout.split())
    packages = {name.split(".")[1] for name in loaded if name.startswith("splitrl.")}
    assert packages & SERVICE_PACKAGES == {service.replace("-", "_")}
    assert f"splitrl.{service.replace('-', '_')}.settings" in loaded
    assert not {"splitrl.run.plan", "splitrl.run.settings", "torch", "cryptography"} & loaded


def test_a_served_service_still_takes_its_share_of_a_recipe(tmp_path):
    # The recipe is read through the whole run's settings, imported only when --config is given.
    config = tmp_path / "bad.yaml"
    config.write_text("stepz: 5\n")
    command = [sys.executable, "-m", "splitrl.cli.main", "serve", "environment", "--config", str(config)]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "splitrl serve environment: " in refused.stderr and "unknown settings 'stepz'" in refused.stderr


def test_serve_help_lists_every_service(parser, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    listed = capsys.readouterr().out
    assert all(name in listed for name in ("environment", "edge-encoder", "inference", "replay", "learner"))

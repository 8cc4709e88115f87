"""Settings models <-> argparse: each field is a flag, and SPLITRL_<FIELD> in the environment.

Precedence: command-line flag, then environment variable (an empty one counts as
unset, as compose's `${VAR:-}` writes it), then the config file given with
`--config` (a YAML mapping of field names to values, e.g. configs/carracing.yaml),
then the field's default. Values are validated by the
model, so `--num-envs 0` fails with the field's own rule and the value in the message.
"""

from __future__ import annotations

import argparse
import json
import os
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

ENV_PREFIX = "SPLITRL_"
#: Where add_config_argument's `--config` lands: not "config", which a settings model may use as a field.
CONFIG_DEST = "config_file"
M = TypeVar("M", bound=BaseModel)
#: How a `--config` file becomes values of a model: load_config, or a service's share of a run recipe.
ConfigReader = Callable[[Path, type[BaseModel]], dict[str, Any]]


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _choices(annotation: Any) -> list[Any] | None:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return None


def _is_bool(annotation: Any) -> bool:
    if annotation is bool:
        return True
    origin = typing.get_origin(annotation)
    return origin in (typing.Union, types.UnionType) and bool in typing.get_args(annotation)


def add_settings_arguments(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """Add one flag per field of `model`, with its description, default and environment variable in --help."""
    for name, field in model.model_fields.items():
        default = field.get_default(call_default_factory=True, validated_data={})
        # argparse %-formats help (for %(default)s and the like): a literal % in a description is doubled
        help_text = f"{field.description or ''} [env {env_name(name)}; default: {default!r}]".replace("%", "%%")
        if _is_bool(field.annotation):
            parser.add_argument(
                flag_name(name),
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
            continue
        parser.add_argument(
            flag_name(name),
            dest=name,
            default=argparse.SUPPRESS,
            choices=_choices(field.annotation),
            metavar=name.upper(),
            help=help_text,
        )


def add_config_argument(
    parser: argparse.ArgumentParser,
    what: str = "YAML file of settings (keys are the flag names, with - or _)",
) -> None:
    """`--config FILE`: settings from a YAML file, below flags and environment variables."""
    parser.add_argument(
        "--config",
        dest=CONFIG_DEST,
        type=Path,
        metavar="FILE",
        default=None,
        help=f"{what}; flags and SPLITRL_* variables override it [env {env_name('config')}]",
    )


def load_config(path: Path, model: type[BaseModel]) -> dict[str, Any]:
    """The settings in YAML file `path`, keys normalised to field names; ValueError for a key `model` lacks."""
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"config {path}: {error}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(f"config {path}: expected a mapping of settings, got {type(loaded).__name__}")
    values = {str(key).replace("-", "_"): value for key, value in loaded.items()}
    unknown = sorted(set(values) - set(model.model_fields))
    if unknown:
        raise ValueError(f"config {path}: unknown settings {', '.join(map(repr, unknown))}")
    return values


def to_argv(values: Mapping[str, Any]) -> list[str]:
    """Flags for `values` ({"num_envs": 4} -> ["--num-envs", "4"]): how one splitrl process starts another."""
    argv: list[str] = []
    for name, value in values.items():
        if isinstance(value, bool):  # booleans are --flag / --no-flag (argparse.BooleanOptionalAction)
            argv.append(flag_name(name) if value else f"--no-{flag_name(name).removeprefix('--')}")
        else:
            argv += [flag_name(name), str(value)]
    return argv


def settings_argv(settings: BaseModel) -> list[str]:
    """Flags that rebuild `settings` in a child process: every field that was set (defaults stay the child's),
    JSON for mappings and lists, and None left out (unset)."""
    values = {
        name: json.dumps(value) if isinstance(value, dict | list) else value
        for name, value in settings.model_dump(mode="json", exclude_unset=True).items()
        if value is not None
    }
    return to_argv(values)


def given_values(
    model: type[BaseModel],
    namespace: argparse.Namespace,
    environ: Mapping[str, str],
    read_config: ConfigReader = load_config,
) -> dict[str, Any]:
    """The values set by flags, non-empty SPLITRL_* variables or the `--config` file (in that precedence),
    the file read by `read_config`; no defaults."""
    values: dict[str, Any] = {}
    if hasattr(namespace, CONFIG_DEST):  # only commands that take --config read SPLITRL_CONFIG
        config = getattr(namespace, CONFIG_DEST) or environ.get(env_name("config"))
        values = read_config(Path(config), model) if config else {}
    for name in model.model_fields:
        if hasattr(namespace, name):
            values[name] = getattr(namespace, name)
        elif environ.get(env_name(name), "") != "":
            values[name] = environ[env_name(name)]
    return values


def validate_settings(model: type[M], values: Mapping[str, Any]) -> M:
    """`model` from `values`; ValueError names each bad field by its flag and variable, with the value given."""
    try:
        return model.model_validate(values)
    except ValidationError as error:
        problems = [_problem(e) for e in error.errors()]
        raise ValueError("invalid settings:\n  " + "\n  ".join(problems)) from None


def _problem(error: Any) -> str:
    """One validation error as a line: the field's flag and variable with the value given, or, for a rule across
    fields (a model validator, whose error has no field), its message alone, which names the fields itself."""
    if not error["loc"]:
        return str(error["msg"]).removeprefix("Value error, ")
    field = str(error["loc"][0])
    return f"{flag_name(field)} / {env_name(field)}: {error['msg']} (got {error.get('input')!r})"


def settings_from_args(
    model: type[M],
    namespace: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    read_config: ConfigReader = load_config,
) -> M:
    """Build `model` from parsed flags, falling back to SPLITRL_* variables, then to the `--config` file.

    ValueError names the bad field.
    """
    environ = os.environ if environ is None else environ
    return validate_settings(model, given_values(model, namespace, environ, read_config))

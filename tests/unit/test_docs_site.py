"""The docs site: `mkdocs build --strict` passes (every page built, every internal link and anchor found), and
its generated reference pages cover what they are generated from: every command and flag of the parser,
every service, rpc, message, field and enum value of the protos with its comment, every metric family."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

from splitrl.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("docs_reference", REPO / "scripts" / "docs_reference.py")
assert spec and spec.loader
docs_reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(docs_reference)


def test_the_site_builds_strictly(tmp_path):
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for page in ("reference/cli", "reference/wire", "reference/metrics", "security", "reliability", "results/sb3"):
        assert (tmp_path / "site" / page / "index.html").exists(), page


def _commands(parser: argparse.ArgumentParser, path: str):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{path} {name}")


def test_the_cli_reference_lists_every_command_and_flag():
    page = docs_reference.cli_markdown()
    commands = list(_commands(build_parser(), "splitrl"))
    assert len(commands) > 15
    for path, parser in commands:
        section = page[page.index(f"`{path}`\n") :]
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):  # every command's -h, left out of the tables
                continue
            for flag in action.option_strings:
                assert f"`{flag}`" in section, (path, flag)


def test_the_wire_reference_has_every_element_of_the_protos_with_its_comment():
    page = docs_reference.wire_markdown()
    files = [file for file in docs_reference.descriptor_set().file if file.name.startswith("splitrl/")]
    assert {file.name for file in files} >= {"splitrl/v1/tensor.proto", "splitrl/v1/rollout.proto"}
    for file in files:
        assert f"## {file.name}" in page
        for service in file.service:
            assert f"### service {service.name}" in page
            assert all(f"| `{method.name}` |" in page for method in service.method), service.name
        for message in file.message_type:
            _assert_message(page, message)
    # A comment from the source reaches the page (joined into one paragraph).
    assert "Dimensions, outermost first" in page


def _assert_message(page: str, message: descriptor_pb2.DescriptorProto, prefix: str = "") -> None:
    name = prefix + message.name
    assert f"### {name}\n" in page, name
    section = page[page.index(f"### {name}\n") :]
    for field in message.field:
        assert f"| `{field.name}` | {field.number} |" in section, (name, field.name)
    for nested in message.nested_type:
        if not nested.options.map_entry:
            _assert_message(page, nested, f"{name}.")


def test_the_metrics_reference_has_every_family():
    from splitrl.core.metrics import SERVICE_FAMILIES, SHARED_FAMILIES

    page = docs_reference.metrics_markdown()
    for family in SHARED_FAMILIES | set().union(*SERVICE_FAMILIES.values()):
        assert f"`{family}" in page, family

"""The docs site's generated reference pages: the CLI from `splitrl`'s argparse parser, the wire protocol from
the comments in protos/ (through the FileDescriptorSet grpcio-tools' protoc writes with source info).

`scripts/mkdocs_hooks.py` adds both pages to every `mkdocs build`, so they cannot drift from the code;
`python scripts/docs_reference.py cli|wire` prints one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"

# FileDescriptorProto / DescriptorProto / ServiceDescriptorProto / EnumDescriptorProto field numbers: the
# path a SourceCodeInfo.Location names its element by.
FILE_MESSAGE, FILE_ENUM, FILE_SERVICE = 4, 5, 6
MESSAGE_FIELD, MESSAGE_NESTED, MESSAGE_ENUM = 2, 3, 4
SERVICE_METHOD, ENUM_VALUE = 2, 2


def _escape(text: str) -> str:
    """`text` safe inside a markdown table cell (and not read as HTML)."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


# -- CLI ---------------------------------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, help) of each subcommand `parser` takes, in the order they were added."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            found += [(name, sub, helps.get(name, "")) for name, sub in action.choices.items()]
    return found


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.metavar or action.dest}`"
        help_text = (action.help or "") % {"default": action.default} if "%(" in (action.help or "") else action.help
        rows.append(f"| {names} | {_escape(help_text or '')} |")
    return rows


def _command_sections(parser: argparse.ArgumentParser, path: str, depth: int) -> Iterator[str]:
    subcommands = _subcommands(parser)
    yield f"{'#' * min(depth, 6)} `{path}`\n"
    if parser.description:
        yield _escape_block(parser.description) + "\n"
    rows = _option_rows(parser)
    if rows:
        yield "| option | what |\n| --- | --- |\n" + "\n".join(rows) + "\n"
    if parser.epilog:
        yield _escape_block(parser.epilog) + "\n"
    if subcommands:
        yield (
            "| command | what |\n| --- | --- |\n"
            + "\n".join(f"| `{path} {name}` | {_escape(help_text)} |" for name, _, help_text in subcommands)
            + "\n"
        )
    for name, sub, _ in subcommands:
        yield from _command_sections(sub, f"{path} {name}", depth + 1)


def _escape_block(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;")


def cli_markdown() -> str:
    """The `splitrl` command, every subcommand and option, as its parser defines them."""
    from splitrl.cli.main import build_parser

    head = (
        "# CLI reference\n\n"
        "Generated from `splitrl`'s own argument parser at every docs build; `splitrl COMMAND --help` prints "
        "the same. Every option of a service (and of `splitrl up`) is also an environment variable: "
        "`--num-envs` is `SPLITRL_NUM_ENVS` (see [Settings](settings.md)).\n\n"
    )
    return head + "\n".join(_command_sections(build_parser(), "splitrl", 2))


# -- metrics ---------------------------------------------------------------------------------------------


def metrics_markdown() -> str:
    """Every Prometheus family `splitrl.core.metrics.Metrics` defines: type, labels, help, who exports it."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics import MetricWrapperBase

    from splitrl.core.metrics import SERVICE_FAMILIES, SHARED_FAMILIES, Metrics

    families = [value for value in vars(Metrics(CollectorRegistry())).values() if isinstance(value, MetricWrapperBase)]
    rows = []
    for family in sorted(families, key=lambda family: family._name):
        name = family._name
        if name in SHARED_FAMILIES:
            exporters = "every service"
        else:
            exporters = ", ".join(service for service, names in SERVICE_FAMILIES.items() if name in names) or "-"
        suffix = {"counter": "_total", "info": "_info"}.get(family._type, "")
        labels = ", ".join(f"`{label}`" for label in family._labelnames)
        meaning = _escape(family._documentation)
        rows.append(f"| `{name}{suffix}` | {family._type} | {labels} | {exporters} | {meaning} |")
    return (
        "# Metrics reference\n\n"
        "Generated at every docs build from `splitrl.core.metrics`, where every series splitrl exports is "
        "defined. Each service serves its families on `/metrics` (`--metrics-port`), beside prometheus_client's "
        "`process_*` series. A summary's samples are `NAME_count` and `NAME_sum`, a histogram's `NAME_bucket` "
        "too. [Concepts](../concepts.md#what-crosses-the-wan-and-how-it-is-counted) explains the link "
        "accounting; Prometheus recording rules in `deploy/prometheus/rules/` give WAN bytes per env step, "
        "overall, by phase, and by mode and phase (`splitrl:wan_bytes_per_env_step_by_mode_phase:rate1m`).\n\n"
        "| series | type | labels | exported by | meaning |\n| --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"
    )


# -- wire protocol -----------------------------------------------------------------------------------------


def descriptor_set() -> object:
    """protos/ compiled by grpcio-tools' protoc into a FileDescriptorSet that keeps the comments."""
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    protos = sorted(str(path.relative_to(PROTO_ROOT)) for path in PROTO_ROOT.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "splitrl.pb"
        args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--descriptor_set_out={out}", "--include_source_info"]
        if protoc.main([*args, *protos]) != 0:
            raise RuntimeError(f"protoc could not compile {protos}")
        files = descriptor_pb2.FileDescriptorSet()
        files.ParseFromString(out.read_bytes())
    return files


def _comments(source_info: object) -> dict[tuple[int, ...], str]:
    comments = {}
    for location in source_info.location:  # type: ignore[attr-defined]
        text = "\n".join(part for part in (location.leading_comments, location.trailing_comments) if part.strip())
        if text.strip():
            comments[tuple(location.path)] = "\n".join(line.strip() for line in text.strip().splitlines())
    return comments


def _paragraph(text: str) -> str:
    """A proto comment as markdown: its paragraphs kept, its lines joined."""
    return "\n\n".join(" ".join(block.split("\n")) for block in text.split("\n\n") if block.strip())


TYPE_NAMES = {
    1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64", 7: "fixed32", 8: "bool",
    9: "string", 12: "bytes", 13: "uint32", 15: "sfixed32", 16: "sfixed64", 17: "sint32", 18: "sint64",
}  # fmt: skip
LABEL_REPEATED = 3


def _field_type(field: object) -> str:
    type_name = getattr(field, "type_name", "")
    name = type_name.rsplit(".", 1)[-1] if type_name else TYPE_NAMES.get(field.type, str(field.type))  # type: ignore[attr-defined]
    link = f"[`{name}`](#{name.lower()})" if type_name.startswith(".splitrl.") else f"`{name}`"
    return f"repeated {link}" if field.label == LABEL_REPEATED else link  # type: ignore[attr-defined]


Comments = dict[tuple[int, ...], str]


def _message(message: object, path: tuple[int, ...], comments: Comments, prefix: str) -> Iterator[str]:
    name = prefix + message.name  # type: ignore[attr-defined]
    yield f"### {name}\n"
    if path in comments:
        yield _paragraph(comments[path]) + "\n"
    fields = message.field  # type: ignore[attr-defined]
    if fields:
        rows = [
            f"| `{field.name}` | {field.number} | {_field_type(field)} | "
            f"{_escape(_paragraph(comments.get((*path, MESSAGE_FIELD, index), '')))} |"
            for index, field in enumerate(fields)
        ]
        yield "| field | number | type | meaning |\n| --- | ---: | --- | --- |\n" + "\n".join(rows) + "\n"
    for index, enum in enumerate(message.enum_type):  # type: ignore[attr-defined]
        yield from _enum(enum, (*path, MESSAGE_ENUM, index), comments, f"{name}.")
    for index, nested in enumerate(message.nested_type):  # type: ignore[attr-defined]
        if not nested.options.map_entry:
            yield from _message(nested, (*path, MESSAGE_NESTED, index), comments, f"{name}.")


def _enum(enum: object, path: tuple[int, ...], comments: dict[tuple[int, ...], str], prefix: str) -> Iterator[str]:
    yield f"### {prefix}{enum.name}\n"  # type: ignore[attr-defined]
    if path in comments:
        yield _paragraph(comments[path]) + "\n"
    rows = [
        f"| `{value.name}` | {value.number} | {_escape(_paragraph(comments.get((*path, ENUM_VALUE, index), '')))} |"
        for index, value in enumerate(enum.value)  # type: ignore[attr-defined]
    ]
    yield "| value | number | meaning |\n| --- | ---: | --- |\n" + "\n".join(rows) + "\n"


def _service(service: object, path: tuple[int, ...], comments: dict[tuple[int, ...], str]) -> Iterator[str]:
    yield f"### service {service.name}\n"  # type: ignore[attr-defined]
    if path in comments:
        yield _paragraph(comments[path]) + "\n"
    rows = []
    for index, method in enumerate(service.method):  # type: ignore[attr-defined]
        request = ("stream " if method.client_streaming else "") + method.input_type.rsplit(".", 1)[-1]
        response = ("stream " if method.server_streaming else "") + method.output_type.rsplit(".", 1)[-1]
        meaning = _escape(_paragraph(comments.get((*path, SERVICE_METHOD, index), "")))
        rows.append(f"| `{method.name}` | `{request}` | `{response}` | {meaning} |")
    yield "| rpc | request | response | meaning |\n| --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"


def wire_markdown() -> str:
    """Every service, message and enum of protos/, with the comments the .proto files give them."""
    parts = [
        "# Wire protocol reference\n",
        "Generated at every docs build from the comments in `protos/splitrl/v1/*.proto` (protoc's descriptor "
        "set, with source info). The `.proto` files are the contract; `services/splitrl/v1/` is the code "
        "generated from them (`python scripts/gen_protos.py`).\n",
    ]
    for file in descriptor_set().file:  # type: ignore[attr-defined]
        if not file.name.startswith("splitrl/"):
            continue
        comments = _comments(file.source_code_info)
        parts.append(f"## {file.name}\n")
        syntax_path = (12,)  # the comment above `syntax = ...`: the file's own description
        if syntax_path in comments:
            parts.append(_paragraph(comments[syntax_path]) + "\n")
        for index, service in enumerate(file.service):
            parts += _service(service, (FILE_SERVICE, index), comments)
        for index, message in enumerate(file.message_type):
            parts += _message(message, (FILE_MESSAGE, index), comments, "")
        for index, enum in enumerate(file.enum_type):
            parts += _enum(enum, (FILE_ENUM, index), comments, "")
    return "\n".join(parts)


if __name__ == "__main__":
    pages = {"cli": cli_markdown, "metrics": metrics_markdown, "wire": wire_markdown}
    if len(sys.argv) != 2 or sys.argv[1] not in pages:
        raise SystemExit(f"usage: python scripts/docs_reference.py {'|'.join(pages)}")
    print(pages[sys.argv[1]]())

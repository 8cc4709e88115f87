"""mkdocs hooks (mkdocs.yml `hooks:`): the reference pages generated from the code at every build.

reference/cli.md comes from `splitrl`'s argparse parser, reference/metrics.md from splitrl.core.metrics,
reference/wire.md from the comments in protos/ (scripts/docs_reference.py); none is checked in, so none can
drift from the code it describes. changelog.md is the repository's CHANGELOG.md, which has one home.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).resolve().parent))

import docs_reference


def _changelog() -> str:
    return (Path(__file__).resolve().parent.parent / "CHANGELOG.md").read_text()


GENERATED = {
    "changelog.md": _changelog,
    "reference/cli.md": docs_reference.cli_markdown,
    "reference/metrics.md": docs_reference.metrics_markdown,
    "reference/wire.md": docs_reference.wire_markdown,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for path, render in GENERATED.items():
        files.append(File.generated(config, path, content=render()))
    return files

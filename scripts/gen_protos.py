"""Regenerate services/splitrl/v1 from protos/ (the one command: `python scripts/gen_protos.py`).

The output is checked in; tests/unit/test_protos_fresh.py fails when it is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT = ROOT / "services"


def generate(out_dir: Path = OUT) -> list[Path]:
    """Run protoc over every .proto under protos/ into out_dir; return the .proto files."""
    protos = sorted(PROTO_ROOT.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    init = out_dir / "splitrl" / "v1" / "__init__.py"
    init.write_text('"""Generated from protos/splitrl/v1 by scripts/gen_protos.py. Do not edit."""\n')
    return protos


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)

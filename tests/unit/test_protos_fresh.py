"""The checked-in generated code is exactly what scripts/gen_protos.py produces from protos/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh(tmp_path):
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    gen_protos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_protos)
    protos = gen_protos.generate(tmp_path)
    assert protos, "no .proto files found"
    generated = sorted(p.relative_to(tmp_path) for p in (tmp_path / "splitrl" / "v1").iterdir() if p.is_file())
    checked_in = sorted(
        p.relative_to(ROOT / "services") for p in (ROOT / "services" / "splitrl" / "v1").iterdir() if p.is_file()
    )
    assert generated == checked_in, "files differ; run: python scripts/gen_protos.py"
    for relative in generated:
        assert (tmp_path / relative).read_bytes() == (ROOT / "services" / relative).read_bytes(), (
            f"{relative} is stale; run: python scripts/gen_protos.py"
        )

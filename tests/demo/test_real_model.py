"""The real model (SmolLM2-135M-Instruct from PyPI) through real ``mlx_lm.server`` processes: the
conversion answers like the model, an 8-bit build answers the same, and an mxfp4 build (its tied
embedding quantized too) states a wrong capital: a real lossy failure for the quality gate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mcp_infra.contracts import Budgets, BuildSpec
from mcp_infra.demo.smollm import LICENSE, RealModel
from mcp_infra.state.builds import make_build
from mcp_infra.state.gguf import convert_gguf
from tests.helpers.realmodel import FRANCE, ask, capital_claims, code_block

ADD = "Write a Python function add(a, b) that returns the sum of a and b."
PARIS = ("France", "Paris")


def test_the_conversion_answers_and_writes_code(real_model: RealModel, tmp_path: Path) -> None:
    france, add = ask(real_model.source, [FRANCE, ADD], tmp_path, max_tokens=64)
    assert capital_claims(france) == {PARIS}, france
    check = code_block(add) + "\nassert add(2, 3) == 5 and add(-1, 1) == 0\n"
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, timeout=30)
    assert run.returncode == 0, (add, run.stderr[-300:])
    (shipped,) = ask(real_model.shipped, [FRANCE], tmp_path)
    assert capital_claims(shipped) == {PARIS}, shipped
    quantization = json.loads((real_model.shipped / "config.json").read_text())["quantization"]
    assert (quantization["bits"], quantization["model.embed_tokens"]["bits"]) == (4, 8)
    assert real_model.license == LICENSE == "Apache-2.0"
    assert "Apache License" in (real_model.source / "LICENSE").read_text()


def test_the_conversion_is_byte_identical_again(real_model: RealModel, tmp_path: Path) -> None:
    licence = {"LICENSE": (real_model.source / "LICENSE").read_bytes()}
    again = convert_gguf(
        real_model.gguf, tmp_path / "bf16", dequantize="bfloat16", extra_files=licence
    )
    names = sorted(p.name for p in real_model.source.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (again / name).read_bytes() == (real_model.source / name).read_bytes(), name


def test_an_mxfp4_build_states_a_wrong_capital_where_8_bit_does_not(
    real_model: RealModel, tmp_path: Path
) -> None:
    builds = tmp_path / "builds"
    eight = make_build(real_model.source, BuildSpec(q_bits=8, dtype="float32"), builds, Budgets())
    mxfp4 = make_build(
        real_model.source, BuildSpec(q_mode="mxfp4", dtype="float32"), builds, Budgets()
    )
    (right,) = ask(Path(eight.folder), [FRANCE], tmp_path)
    (wrong,) = ask(Path(mxfp4.folder), [FRANCE], tmp_path)
    assert capital_claims(right) == {PARIS}, right
    claims = capital_claims(wrong)
    assert claims and PARIS not in claims, f"the mxfp4 build answered {wrong!r}"

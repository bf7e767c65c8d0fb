"""The pure rules of builds: what the converter offers, what a build needs on disk, whether it
fits, and which compute dtype a probe names."""

from __future__ import annotations

import pytest

from mcp_infra.contracts import BuildSpec
from mcp_infra.core.builds import (
    GB,
    bits_per_weight,
    disk_problems,
    fastest_dtype,
    need_bytes,
    offered_choices,
    unoffered,
)

HELP = """usage: __main__.py [-h] [--hf-path HF_PATH]
  --q-mode {affine,mxfp4,nvfp4,mxfp8}
                        The quantization mode.
  --quant-predicate {mixed_2_6,mixed_3_4,mixed_3_6,mixed_4_6}
                        Mixed-bit quantization recipe.
  --dtype {float16,bfloat16,float32}
"""
OLD_HELP = "  --q-bits Q_BITS\n  --dtype {float16,bfloat16}\n"


def test_offered_choices_are_read_from_the_help() -> None:
    offered = offered_choices(HELP)
    assert offered["--q-mode"] == {"affine", "mxfp4", "nvfp4", "mxfp8"}
    assert "mixed_3_6" in offered["--quant-predicate"]
    assert offered_choices(OLD_HELP) == {"--dtype": frozenset({"float16", "bfloat16"})}


def test_a_spec_the_installed_converter_lacks_is_named() -> None:
    assert unoffered(BuildSpec(q_mode="mxfp4", dtype="float32"), offered_choices(HELP)) is None
    old = offered_choices(OLD_HELP)
    assert unoffered(BuildSpec(q_bits=8), old) is None  # affine is always there
    assert unoffered(BuildSpec(q_mode="mxfp4"), old) == (
        "the installed mlx_lm convert does not offer --q-mode mxfp4 (no such option)"
    )
    problem = unoffered(BuildSpec(q_bits=8, dtype="float32"), old)
    assert problem and "--dtype float32 (it lists bfloat16, float16)" in problem
    assert unoffered(BuildSpec(quant_predicate="mixed_3_6"), old)


@pytest.mark.parametrize(
    ("spec", "source_bits", "bits"),
    [
        (BuildSpec(q_bits=8), 16, 8 + 32 / 64),  # scale and bias in bf16 per 64 weights
        (BuildSpec(q_bits=4, dtype="float32"), 16, 4 + 64 / 64),
        (BuildSpec(q_bits=4, q_group_size=32), 32, 4 + 64 / 32),
        (BuildSpec(q_mode="mxfp4"), 16, 4 + 8 / 32),  # one 8-bit scale per 32, no bias
        (BuildSpec(quant_predicate="mixed_3_6"), 16, 6 + 32 / 64),  # its high width
        (BuildSpec(quantize=False, dtype="float32"), 16, 32),
    ],
)
def test_bits_per_weight(spec: BuildSpec, source_bits: int, bits: float) -> None:
    assert bits_per_weight(spec, source_bits) == pytest.approx(bits)


def test_the_need_follows_the_bits_and_fits_or_is_refused() -> None:
    source = int(2 * GB)  # a bf16 source of 1 G parameters
    need = need_bytes(BuildSpec(q_bits=8), source, 16)
    assert need == pytest.approx(source * 8.5 / 16 * 1.1, rel=1e-6)
    assert disk_problems(need, free=int(10 * GB), builds_bytes=0, budget_gb=100) == []
    short = disk_problems(need, free=int(1.5 * GB), builds_bytes=0, budget_gb=100)
    assert len(short) == 1 and short[0].startswith("only 1.50 GB free")
    over = disk_problems(need, free=int(10 * GB), builds_bytes=int(99.5 * GB), budget_gb=100)
    assert len(over) == 1 and "exceed the policy's disk budget of 100 GB" in over[0]


def test_the_fastest_dtype_wins_and_a_tie_goes_to_the_wider() -> None:
    assert fastest_dtype({"float32": 140.0, "bfloat16": 21.0, "float16": 4.9}) == "float32"
    assert fastest_dtype({"float32": 150.0, "bfloat16": 180.0}) == "bfloat16"
    assert fastest_dtype({"float16": 10.0, "bfloat16": 10.0, "float32": 10.0}) == "float32"

"""Builds made by a real ``mlx_lm convert`` from the demo's tiny target: recorded, hashed,
reused, refused when changed, refused before a byte is written when they cannot fit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mcp_infra.contracts import Budgets, BuildRecord, BuildSpec, DtypeProbe
from mcp_infra.state.builds import (
    BuildRefused,
    BuildTampered,
    make_build,
    probe_compute_dtype,
    verify_build,
)
from mcp_infra.state.folders import folder_digest
from mcp_infra.state.store import read_model

Q8_F32 = BuildSpec(q_bits=8, dtype="float32")


def contents(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != ".lock")


def test_a_build_is_made_recorded_reused_and_the_same_twice(
    demo_models: dict[str, Path], tmp_path: Path
) -> None:
    source = demo_models["target"]
    record = make_build(source, Q8_F32, tmp_path / "builds", Budgets())
    folder = Path(record.folder)
    assert folder.name == f"q8-g64-affine-f32-{record.digest[:12]}"
    assert contents(tmp_path / "builds") == [folder.name, f"{folder.name}.json"]
    assert read_model(folder.with_name(folder.name + ".json"), BuildRecord) == record
    assert record.argv[1:6] == ["-m", "mlx_lm", "convert", "--hf-path", str(source.resolve())]
    assert record.argv[record.argv.index("--mlx-path") + 2 :] == Q8_F32.convert_args()
    assert record.digest == folder_digest(folder) and record.source_digest == folder_digest(source)
    assert record.size_bytes == sum(f.size for f in record.files) > 0
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization"]["bits"] == 8 and config["quantization"]["group_size"] == 64

    assert make_build(source, Q8_F32, tmp_path / "builds", Budgets()) == record  # reused
    elsewhere = make_build(source, Q8_F32, tmp_path / "other", Budgets())
    assert elsewhere.digest == record.digest  # the converter is deterministic
    folder.with_name(folder.name + ".json").unlink()  # a lost record: made again, same bytes
    again = make_build(source, Q8_F32, tmp_path / "builds", Budgets())
    assert (again.folder, again.digest) == (record.folder, record.digest)
    assert again.created_at > record.created_at

    (folder / "config.json").write_text(json.dumps({**config, "rope_theta": 1.0}))
    with pytest.raises(BuildTampered, match=r"differs from its record: config\.json: "):
        make_build(source, Q8_F32, tmp_path / "builds", Budgets())
    with pytest.raises(BuildTampered, match="config.json"):
        verify_build(record)
    shutil.rmtree(folder)
    with pytest.raises(BuildTampered, match="is gone"):
        verify_build(record)


def test_a_mixed_recipe_builds_where_the_converter_offers_it(
    demo_models: dict[str, Path], tmp_path: Path
) -> None:
    spec = BuildSpec(quant_predicate="mixed_3_6", dtype="float32")
    record = make_build(demo_models["target"], spec, tmp_path / "builds", Budgets())
    quantization = json.loads((Path(record.folder) / "config.json").read_text())["quantization"]
    widths = {v["bits"] for v in quantization.values() if isinstance(v, dict)}
    assert widths == {3, 6}, "the recipe gives some layers 3 bits and some 6"


def test_builds_that_cannot_be_made_are_refused_before_anything_is_written(
    demo_models: dict[str, Path], tmp_path: Path
) -> None:
    builds = tmp_path / "builds"
    with pytest.raises(BuildRefused, match="exceed the policy's disk budget of 1e-06 GB"):
        make_build(demo_models["target"], Q8_F32, builds, Budgets(disk_gb=0.000001))
    assert contents(builds) == []
    made = make_build(demo_models["target"], BuildSpec(q_bits=4), builds, Budgets())
    with pytest.raises(BuildRefused, match="quantized already"):
        make_build(Path(made.folder), Q8_F32, builds, Budgets())
    assert len(contents(builds)) == 2


def test_the_compute_dtype_probe_times_each_dtype_and_names_the_fastest(
    demo_models: dict[str, Path],
) -> None:
    probe = probe_compute_dtype(demo_models["target"], BuildSpec(q_bits=8, dtype="bfloat16"))
    assert probe.key == "q8-g64-affine-src"  # the spec with its dtype left open
    assert (probe.model_type, probe.layers, probe.vocab_size) == ("qwen3", 2, 512)
    assert (probe.hidden_size, probe.intermediate_size) == (64, 128)
    assert set(probe.rates) == {"float32", "bfloat16", "float16"}
    assert all(rate > 0 for rate in probe.rates.values())
    assert probe.rates[probe.fastest] == max(probe.rates.values())
    assert DtypeProbe.model_validate_json(probe.model_dump_json()) == probe
    mixed = probe_compute_dtype(demo_models["target"], BuildSpec(quant_predicate="mixed_3_6"))
    assert mixed.key == "mixed_3_6-g64-affine-src" and min(mixed.rates.values()) > 0
    plain = probe_compute_dtype(demo_models["target"], BuildSpec(quantize=False, dtype="float16"))
    assert plain.key == "unquantized"

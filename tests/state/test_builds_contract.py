"""Build specs refuse what ``mlx_lm.convert`` would refuse; a folder's identity and its changes."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from mcp_infra.contracts import BuildSpec
from mcp_infra.state.folders import (
    FolderError,
    folder_digest,
    folder_inventory,
    inventory_changes,
)
from mcp_infra.state.store import inventory_digest


@pytest.mark.parametrize(
    ("spec", "key", "args"),
    [
        (
            BuildSpec(q_bits=8, dtype="float32"),
            "q8-g64-affine-f32",
            ["-q", "--q-bits", "8", "--dtype", "float32"],
        ),
        (BuildSpec(q_bits=4), "q4-g64-affine-src", ["-q", "--q-bits", "4"]),
        (BuildSpec(q_mode="mxfp4"), "q4-g32-mxfp4-src", ["-q", "--q-mode", "mxfp4"]),
        (BuildSpec(q_mode="nvfp4"), "q4-g16-nvfp4-src", ["-q", "--q-mode", "nvfp4"]),
        (
            BuildSpec(quant_predicate="mixed_3_6", dtype="bfloat16"),
            "mixed_3_6-g64-affine-bf16",
            ["-q", "--q-group-size", "64", "--quant-predicate", "mixed_3_6", "--dtype", "bfloat16"],
        ),
        (BuildSpec(quantize=False, dtype="float32"), "f32", ["--dtype", "float32"]),
    ],
)
def test_spec_key_and_convert_args(spec: BuildSpec, key: str, args: list[str]) -> None:
    assert spec.key() == key
    assert spec.convert_args() == args
    assert BuildSpec.model_validate(spec.model_dump()) == spec


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (
            BuildSpec(q_bits=8, dtype="float32"),
            "8-bit affine weights in groups of 64, float32 compute",
        ),
        (
            BuildSpec(q_mode="mxfp4"),
            "4-bit mxfp4 weights in groups of 32, the source's compute dtype",
        ),
        (
            BuildSpec(quant_predicate="mixed_3_6", dtype="bfloat16"),
            "mixed 3- and 6-bit affine (mixed_3_6) weights in groups of 64, bfloat16 compute",
        ),
        (BuildSpec(quantize=False, dtype="float32"), "a copy with float32 compute"),
    ],
)
def test_a_spec_says_what_it_builds_in_words(spec: BuildSpec, words: str) -> None:
    assert spec.describe() == words


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"q_mode": "mxfp4", "q_bits": 8}, "mxfp4 takes bits (4,)"),
        ({"q_mode": "mxfp4", "q_group_size": 64}, "mxfp4 takes group size 32"),
        ({"q_mode": "mxfp8", "q_bits": 4}, "mxfp8 takes bits (8,)"),
        ({"q_mode": "nvfp4", "q_group_size": 32}, "only its default group size (16)"),
        ({"quant_predicate": "mixed_3_6", "q_mode": "mxfp4"}, "only q_mode affine"),
        ({"quant_predicate": "mixed_3_6", "q_bits": 4}, "leave q_bits unset"),
        ({"quantize": False}, "must name a dtype"),
        ({"quantize": False, "q_bits": 4, "dtype": "float32"}, "need quantize"),
        ({"q_bits": 7}, "q_bits"),
        ({"q_group_size": 16}, "q_group_size"),
        ({"dtype": "float64"}, "dtype"),
    ],
)
def test_impossible_specs_are_refused(fields: dict[str, object], reason: str) -> None:
    with pytest.raises(ValidationError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        BuildSpec.model_validate(fields)


def test_folder_identity_names_every_change(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "sub" / "w.bin").write_bytes(b"abc")
    (tmp_path / "blob").write_bytes(b"linked")
    (folder / "link.bin").symlink_to(tmp_path / "blob")
    before = folder_inventory(folder)
    assert [f.path for f in before] == ["config.json", "link.bin", "sub/w.bin"]
    assert before[1].size == len(b"linked")  # links are followed: the bytes are the identity
    assert folder_digest(folder) == inventory_digest(before)
    assert inventory_changes(before, folder_inventory(folder)) == []

    (folder / "config.json").write_text("[]")  # same size, other bytes
    (folder / "sub" / "w.bin").write_bytes(b"abcd")
    (folder / "link.bin").unlink()
    (folder / "extra.txt").write_text("x")
    changes = inventory_changes(before, folder_inventory(folder))
    assert changes[0] == "missing: link.bin"
    assert changes[1] == "added: extra.txt"
    assert changes[2].startswith("config.json: sha256 ")
    assert changes[3] == "sub/w.bin: 4 bytes, recorded 3"
    assert folder_digest(folder) != inventory_digest(before)


def test_unreadable_folders_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FolderError, match="not a folder"):
        folder_inventory(tmp_path / "absent")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "gone").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FolderError, match="gone is a broken link"):
        folder_inventory(tmp_path / "m")

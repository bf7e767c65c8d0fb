"""Quantized builds of a source model (``mlx_lm.convert``): what to make and what was made."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, model_validator

from mcp_infra.contracts.base import SHA256_PATTERN, Contract, InventoryFile, Part

QBits = Literal[2, 3, 4, 5, 6, 8]
QGroupSize = Literal[32, 64, 128]
QMode = Literal["affine", "mxfp4", "nvfp4", "mxfp8"]
QuantPredicate = Literal["mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6"]
ComputeDtype = Literal["float32", "float16", "bfloat16"]

# What MLX's quantizer accepts per mode (``mx.quantize``'s table): the mx/nv formats have one
# group size and one width each; None takes the mode's default. nvfp4's only group size (16) is
# not one a spec can name, so its group size stays None.
MODE_BITS: dict[str, tuple[int, ...]] = {
    "affine": (2, 3, 4, 5, 6, 8),
    "mxfp4": (4,),
    "nvfp4": (4,),
    "mxfp8": (8,),
}
MODE_GROUP_SIZES: dict[str, tuple[int, ...]] = {
    "affine": (32, 64, 128),
    "mxfp4": (32,),
    "nvfp4": (),
    "mxfp8": (32,),
}
MODE_DEFAULTS: dict[str, tuple[int, int]] = {  # (group size, bits) when the spec names none
    "affine": (64, 4),
    "mxfp4": (32, 4),
    "nvfp4": (16, 4),
    "mxfp8": (32, 8),
}
_DTYPE_KEYS = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


class BuildSpec(Part):
    """One build of a source model made by ``mlx_lm.convert``: quantized (``quantize``), or a
    plain copy in another compute dtype (the dtype the non-quantized tensors are stored and
    computed in; None keeps the source's)."""

    quantize: bool = True
    q_bits: QBits | None = None
    q_group_size: QGroupSize | None = None
    q_mode: QMode = "affine"
    quant_predicate: QuantPredicate | None = Field(
        None, description="a mixed-bit recipe (affine only); its low and high widths"
    )
    dtype: ComputeDtype | None = None

    @model_validator(mode="after")
    def _possible(self) -> BuildSpec:
        problem = spec_problem(self)
        if problem:
            raise ValueError(problem)
        return self

    def effective(self) -> tuple[int, int] | None:
        """(group size, bits) the quantizer uses, defaults filled in; None: not quantized."""
        if not self.quantize:
            return None
        group, bits = MODE_DEFAULTS[self.q_mode]
        return self.q_group_size or group, self.q_bits or bits

    def key(self) -> str:
        """A short stable id: ``q8-g64-affine-f32``, ``mixed_3_6-g64-affine-src``,
        ``q4-g32-mxfp4-src``, ``f32`` (a copy in float32)."""
        dtype = _DTYPE_KEYS[self.dtype] if self.dtype else "src"
        eff = self.effective()
        if eff is None:
            return dtype
        group, bits = eff
        width = self.quant_predicate or f"q{bits}"
        return f"{width}-g{group}-{self.q_mode}-{dtype}"

    def describe(self) -> str:
        """What a person reads: ``8-bit affine weights in groups of 64, float32 compute``,
        ``mixed 3- and 6-bit affine (mixed_3_6) weights in groups of 64, the source's
        compute dtype``, ``a copy with float32 compute``."""
        compute = f"{self.dtype} compute" if self.dtype else "the source's compute dtype"
        eff = self.effective()
        if eff is None:
            return f"a copy with {compute}"
        group, bits = eff
        if self.quant_predicate:
            low, high = self.quant_predicate.removeprefix("mixed_").split("_")
            width = f"mixed {low}- and {high}-bit {self.q_mode} ({self.quant_predicate})"
        else:
            width = f"{bits}-bit {self.q_mode}"
        return f"{width} weights in groups of {group}, {compute}"

    def convert_args(self) -> list[str]:
        """The ``mlx_lm convert`` options for this spec (source and output paths excluded)."""
        args: list[str] = []
        if self.quantize:
            args.append("-q")
            if self.q_bits is not None:
                args += ["--q-bits", str(self.q_bits)]
            if self.q_group_size is not None or self.quant_predicate is not None:
                # a mixed recipe is handed the group size as given: name it, never None
                args += ["--q-group-size", str(self.q_group_size or MODE_DEFAULTS["affine"][0])]
            if self.q_mode != "affine":
                args += ["--q-mode", self.q_mode]
            if self.quant_predicate is not None:
                args += ["--quant-predicate", self.quant_predicate]
        if self.dtype is not None:
            args += ["--dtype", self.dtype]
        return args


def spec_problem(spec: BuildSpec) -> str | None:
    """Why ``mlx_lm.convert`` (or MLX's quantizer under it) would refuse this spec; None if
    it is possible."""
    if not spec.quantize:
        named = spec.q_bits, spec.q_group_size, spec.quant_predicate
        if any(v is not None for v in named) or spec.q_mode != "affine":
            return "q_bits, q_group_size, q_mode and quant_predicate need quantize"
        if spec.dtype is None:
            return "a build that does not quantize must name a dtype (else it is a plain copy)"
        return None
    if spec.quant_predicate is not None:
        if spec.q_mode != "affine":
            return "a mixed quant_predicate supports only q_mode affine (mlx_lm.convert)"
        if spec.q_bits is not None:
            return "a mixed quant_predicate sets its own bits: leave q_bits unset"
    if spec.q_bits is not None and spec.q_bits not in MODE_BITS[spec.q_mode]:
        return f"q_mode {spec.q_mode} takes bits {MODE_BITS[spec.q_mode]}, not {spec.q_bits}"
    groups = MODE_GROUP_SIZES[spec.q_mode]
    if spec.q_group_size is not None and spec.q_group_size not in groups:
        allowed = f"group size {groups[0]}" if groups else "only its default group size (16)"
        return f"q_mode {spec.q_mode} takes {allowed}, not {spec.q_group_size}"
    return None


class BuildRecord(Contract):
    """What ``prepare`` made: a build's spec, its source, the exact command and the sha256 of
    every output file (digest as a model folder's identity), written beside the build."""

    spec: BuildSpec
    key: str = Field(description="spec.key() when built")
    source: str = Field(description="the source model folder as given")
    source_digest: str = Field(pattern=SHA256_PATTERN)
    argv: list[str] = Field(description="the command that made it, exactly as run")
    mlx_lm_version: str
    folder: str
    files: list[InventoryFile]
    digest: str = Field(
        pattern=SHA256_PATTERN, description="sha256 over the sorted (path, size, sha256) list"
    )
    size_bytes: int = Field(ge=0)
    duration_s: float = Field(ge=0)
    created_at: datetime


class ConvertedModel(Contract):
    """An MLX model folder converted from a GGUF file (``state.gguf``), recorded beside it."""

    source_file: str
    source_sha256: str = Field(pattern=SHA256_PATTERN)
    dequantize: ComputeDtype | None = Field(
        description="the float dtype every tensor was dequantized into; None: as shipped"
    )
    converter: str = Field(description="the converter's version: another one converts again")
    folder: str
    files: list[InventoryFile]
    digest: str = Field(pattern=SHA256_PATTERN)
    created_at: datetime


class DtypeProbe(Contract):
    """Which compute dtype this machine decodes a build fastest in: one-token decode steps of a
    small random model of the source's architecture, made as the spec says, timed in each dtype
    (steps per second)."""

    key: str = Field(description="the spec probed with its dtype left open, or 'unquantized'")
    model_type: str
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    layers: int = Field(gt=0, description="decoder layers of the probe model")
    vocab_size: int = Field(gt=0, description="its vocabulary (capped)")
    rates: dict[ComputeDtype, float]
    fastest: ComputeDtype
    machine: str = Field(description="the CPU or GPU it ran on")
    mlx_version: str
    measured_at: datetime

"""Rules for quantized builds (pure): what the installed converter offers, what a build needs on
disk, and whether that fits the free space and the policy's disk budget."""

from __future__ import annotations

import re

from mcp_infra.contracts import BuildSpec, ComputeDtype

GB = 1e9  # budgets are in decimal gigabytes, as for downloads
DISK_MARGIN_GB = 1.0  # free space a build leaves untouched (the home keeps logs and evidence)
NEED_FACTOR = 1.1  # slack over the size estimate: config, tokenizer, safetensors headers

_DTYPE_BITS = {"float32": 32, "float16": 16, "bfloat16": 16}
_SCALE_BITS = {"affine": None, "mxfp4": 8, "nvfp4": 8, "mxfp8": 8}  # None: the compute dtype
_BIASED = {"affine"}  # modes that store a bias per group beside the scale


def offered_choices(help_text: str) -> dict[str, frozenset[str]]:
    """The choices ``mlx_lm convert --help`` lists for ``--q-mode``, ``--quant-predicate`` and
    ``--dtype`` (argparse's ``{a,b,c}``); a flag it does not list is absent."""
    found: dict[str, frozenset[str]] = {}
    for flag in ("--q-mode", "--quant-predicate", "--dtype"):
        match = re.search(re.escape(flag) + r"\s+\{([^}]*)\}", help_text)
        if match:
            found[flag] = frozenset(c.strip() for c in match.group(1).split(","))
    return found


def unoffered(spec: BuildSpec, offered: dict[str, frozenset[str]]) -> str | None:
    """Why the installed converter cannot make ``spec`` (a mode, mixed recipe or dtype its
    ``--help`` does not list); None if it can."""
    for flag, value in (
        ("--q-mode", spec.q_mode if spec.q_mode != "affine" else None),
        ("--quant-predicate", spec.quant_predicate),
        ("--dtype", spec.dtype),
    ):
        if value is not None and value not in offered.get(flag, frozenset()):
            listed = sorted(offered.get(flag, frozenset()))
            return f"the installed mlx_lm convert does not offer {flag} {value}" + (
                f" (it lists {', '.join(listed)})" if listed else " (no such option)"
            )
    return None


def bits_per_weight(spec: BuildSpec, source_bits: int) -> float:
    """Stored bits per weight of a build: the quantized width plus its per-group scale (and
    bias), or the dtype's width when it does not quantize. A mixed recipe counts its high
    width (an upper bound)."""
    dtype_bits = _DTYPE_BITS[spec.dtype] if spec.dtype else source_bits
    eff = spec.effective()
    if eff is None:
        return float(dtype_bits)
    group, bits = eff
    if spec.quant_predicate is not None:
        bits = 6 if spec.quant_predicate.endswith("_6") else 4
    scale = _SCALE_BITS[spec.q_mode] or dtype_bits
    per_group = scale * (2 if spec.q_mode in _BIASED else 1)
    return bits + per_group / group


def need_bytes(spec: BuildSpec, source_bytes: int, source_bits: int) -> int:
    """Disk a build of a ``source_bits`` source of ``source_bytes`` needs, with slack."""
    ratio = bits_per_weight(spec, source_bits) / source_bits
    return int(source_bytes * ratio * NEED_FACTOR)


def disk_problems(need: int, free: int, builds_bytes: int, budget_gb: float) -> list[str]:
    """What forbids a build of ``need`` bytes (empty: it fits): the free space (less a margin)
    and the policy's disk budget over the builds the home already holds plus this one."""
    problems = []
    if free < need + DISK_MARGIN_GB * GB:
        problems.append(
            f"only {free / GB:.2f} GB free where builds are written; this build needs about "
            f"{need / GB:.2f} GB (+{DISK_MARGIN_GB:g} GB margin)"
        )
    if (builds_bytes + need) / GB > budget_gb:
        problems.append(
            f"the home's builds ({builds_bytes / GB:.2f} GB) plus this one (about "
            f"{need / GB:.2f} GB) exceed the policy's disk budget of {budget_gb:g} GB"
        )
    return problems


def fastest_dtype(rates: dict[ComputeDtype, float]) -> ComputeDtype:
    """The dtype with the most steps per second; a tie goes to the wider (more exact) one."""
    order: list[ComputeDtype] = ["float32", "bfloat16", "float16"]
    return max((d for d in order if d in rates), key=lambda d: (rates[d], -order.index(d)))

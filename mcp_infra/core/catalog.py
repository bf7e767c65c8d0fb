"""The catalog generated for the configured model (pure): facts in, manifests out.

From a ``CatalogFacts`` (the target folder's facts, the runtimes' own ``--help``, the other
model folders on this machine, its memory) come manifests in the classes a user's model has:

* **server settings** (``own-settings``, lossless): only flags the runtime's --help lists;
* **KV-cache bits** (``own-kv``, lossy): with a group size that divides the head dimension;
* **drafters** (``own-draft-<name>``, lossless): every model smaller than the target, each with
  a few draft lengths and the prompt cache off (mlx-lm 0.32.2's prompt cache is not lossless
  with a drafter); one with another tokenizer is listed and refused by preflight, never started;
* **quantized builds** (``own-builds``, lossy): affine 8, 6 and 4 bits, the mx formats and a
  mixed recipe the installed ``mlx_lm.convert`` offers, in the compute dtype this machine runs
  fastest, made by ``prepare`` (or the cycle's PREPARE step) from a source of higher precision:
  the target itself, or an unquantized model here with its architecture, shapes and tokenizer;
* **the model's own MTP head** (``own-mtp``, lossless, mlx_vlm.server) where its config declares
  multi-token-prediction layers.

Every target is "the configured target" (``ArtifactRef.configured``), so a manifest serves the
model the home serves; whatever the catalog leaves out is a ``CatalogNote`` with its reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from mcp_infra.contracts import (
    ArtifactRef,
    BuildSpec,
    CandidateClass,
    CatalogFacts,
    CatalogNote,
    FolderFacts,
    Knobs,
    Manifest,
    Resources,
    RuntimeHelp,
    RuntimeSpec,
    Semantics,
    TemplateName,
    Variant,
)
from mcp_infra.core import modelfacts
from mcp_infra.core.builds import need_bytes

CATALOG_VERSION = "own-1"
"""Part of the catalog's cache key: bump when the rules below change what they generate."""
PREFIX = "own-"
ALL_PLATFORMS = ["linux-x86_64", "linux-aarch64", "darwin-arm64"]
APPLE = ["darwin-arm64"]
DRAFT_LENGTHS = (2, 4)
MAX_DRAFTERS = 4
DRAFTER_MAX_SHARE = 0.5
"""A drafter is at most half the target's weights: a larger one costs nearly as much as the
target it should save work for."""
PREFILL_STEPS = (512, 4096)
DECODE_CONCURRENCY = (4, 16)
PROMPT_CONCURRENCY = (2, 16)
PROMPT_CACHE_TOKENS = 8192
"""--prompt-cache-bytes is offered as the KV cache of this many tokens of this model."""
KV_BITS = (8, 4)
MTP_BLOCKS = (2, 3)
AFFINE_BITS = (8, 6, 4)
MX_MODES = ("mxfp4", "nvfp4", "mxfp8")
MIXED = ("mixed_3_6", "mixed_4_6", "mixed_2_6", "mixed_3_4")
"""The mixed recipe offered: the first of these the converter lists."""
CONVERT = "mlx_lm.convert"
FLOAT_BITS = {"float32": 32, "float16": 16, "bfloat16": 16}
LM_RUNTIME: TemplateName = "mlx_lm_server"
VLM_RUNTIME: TemplateName = "mlx_vlm_server"
PACKAGES = {LM_RUNTIME: "mlx-lm", VLM_RUNTIME: "mlx-vlm"}


def _help(facts: CatalogFacts, name: str) -> RuntimeHelp | None:
    return next((h for h in facts.runtimes if h.name == name), None)


def _runtime(template: TemplateName, help_: RuntimeHelp, platforms: list[str]) -> RuntimeSpec:
    return RuntimeSpec.model_validate(
        {
            "template": template,
            "min_versions": {PACKAGES[template]: _plain_version(help_.version)},
            "platforms": platforms,
        }
    )


def _plain_version(version: str) -> str:
    match = re.match(r"\d+(\.\d+){0,3}", version)
    return match.group(0) if match else "0"


def _target() -> ArtifactRef:
    return ArtifactRef(role="target", configured=True)


def _memory(*folders: FolderFacts) -> Resources:
    need = modelfacts.memory_need_gb(sum(f.weights_bytes for f in folders))
    return Resources(memory_gb=need, disk_gb=0)


def _kv_bytes_per_token(target: FolderFacts) -> int | None:
    shape = target.shape
    if shape is None or not (shape.num_layers and shape.num_kv_heads and shape.head_dim):
        return None
    width = 4 if (shape.dtype or "").endswith("32") else 2
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * width


def settings_manifest(facts: CatalogFacts) -> tuple[Manifest | None, list[CatalogNote]]:
    """Server settings the runtime lists in its --help, each a lossless variant."""
    help_ = _help(facts, LM_RUNTIME)
    if help_ is None:
        return None, [CatalogNote(subject="server settings", reason="mlx-lm is not installed")]
    flags = set(help_.flags)
    variants: list[Variant] = []

    def offer(flag: str, vid: str, title: str, knobs: Knobs) -> None:
        if flag in flags:
            variants.append(Variant(id=vid, title=title, knobs=knobs))

    for step in PREFILL_STEPS:
        offer(
            "--prefill-step-size",
            f"prefill-{step}",
            f"prefill in steps of {step} tokens",
            Knobs(prefill_step_size=step),
        )
    offer("--prompt-cache-size", "pcache-off", "prompt cache off", Knobs(prompt_cache_size=0))
    per_token = _kv_bytes_per_token(facts.target)
    if per_token:
        mib = max(1, per_token * PROMPT_CACHE_TOKENS >> 20)
        offer(
            "--prompt-cache-bytes",
            f"pcache-{mib}mib",
            f"prompt cache bound to {mib} MiB (the KV cache of {PROMPT_CACHE_TOKENS} tokens)",
            Knobs(prompt_cache_bytes=mib << 20),
        )
    for n in DECODE_CONCURRENCY:
        offer(
            "--decode-concurrency",
            f"decode-c{n}",
            f"decode up to {n} requests in one batch",
            Knobs(decode_concurrency=n),
        )
    for n in PROMPT_CONCURRENCY:
        offer(
            "--prompt-concurrency",
            f"prompt-c{n}",
            f"process up to {n} prompts in one batch",
            Knobs(prompt_concurrency=n),
        )
    if not variants:
        reason = f"mlx-lm {help_.version} lists none of the settings the catalog varies"
        return None, [CatalogNote(subject="server settings", reason=reason)]
    manifest = Manifest(
        id=f"{PREFIX}settings",
        title="The configured model with mlx_lm.server settings from its own --help",
        candidate_class=CandidateClass.SERVER_TUNING,
        semantics=Semantics.LOSSLESS,
        description="Generated for the configured model: each variant changes one server "
        "setting; greedy output must equal the baseline's token for token.",
        license_reviewed=True,
        runtime=_runtime(LM_RUNTIME, help_, ALL_PLATFORMS),
        target=_target(),
        resources=_memory(facts.target),
        variants=variants,
    )
    return manifest, []


def kv_manifest(facts: CatalogFacts) -> tuple[Manifest | None, list[CatalogNote]]:
    """KV-cache bits (lossy), with the largest group size that divides the head dimension."""
    help_ = _help(facts, LM_RUNTIME)
    subject = "KV-cache bits"
    if help_ is None or "--kv-bits" not in help_.flags:
        return None, [CatalogNote(subject=subject, reason="the runtime lists no --kv-bits")]
    shape = facts.target.shape
    head_dim = shape.head_dim if shape else None
    groups = modelfacts.kv_groups(head_dim)
    if not groups:
        reason = (
            f"no KV group size ({', '.join(map(str, modelfacts.KV_GROUP_SIZES))}) divides the "
            f"model's head dimension {head_dim}"
            if head_dim
            else "config.json states no head dimension"
        )
        return None, [CatalogNote(subject=subject, reason=reason)]
    group = groups[0]
    variants = [
        Variant(
            id=f"kv{bits}-g{group}",
            title=f"KV cache in {bits} bits (group {group}) from the first token",
            knobs=Knobs.model_validate(
                {"kv_bits": bits, "kv_group_size": group, "quantized_kv_start": 0}
            ),
        )
        for bits in KV_BITS
    ]
    manifest = Manifest(
        id=f"{PREFIX}kv",
        title="The configured model with its KV cache quantized",
        candidate_class=CandidateClass.KV_CACHE,
        semantics=Semantics.LOSSY,
        description=f"Generated for the configured model (head dimension {head_dim}): KV bits "
        "change the model's numbers, so a person approves a qualified variant by default; "
        "mlx-lm serves one request at a time with KV bits.",
        license_reviewed=True,
        runtime=_runtime(LM_RUNTIME, help_, ALL_PLATFORMS),
        target=_target(),
        resources=_memory(facts.target),
        variants=variants,
    )
    return manifest, []


def _slug(origin: str, path: str) -> str:
    name = origin.split(": ", 1)[-1].split("@", 1)[0] if origin.startswith("hub") else path
    name = name.rstrip("/").rsplit("/", 1)[-1].lower()
    return re.sub(r"[^a-z0-9._-]+", "-", name).strip("-._")[:40] or "model"


def drafter_folders(facts: CatalogFacts) -> tuple[list[FolderFacts], list[CatalogNote]]:
    """The other models that may draft for the target: model folders, at most
    ``DRAFTER_MAX_SHARE`` of its weights, smallest first (at most ``MAX_DRAFTERS``)."""
    target = facts.target
    chosen: list[FolderFacts] = []
    notes: list[CatalogNote] = []
    for other in sorted(facts.others, key=lambda f: (f.weights_bytes, f.path)):
        subject = f"drafter {other.origin or other.path}"
        if other.path == target.path or (other.digest and other.digest == target.digest):
            continue
        if other.missing:
            notes.append(CatalogNote(subject=subject, reason="lacks " + ", ".join(other.missing)))
        elif other.weights_bytes > target.weights_bytes * DRAFTER_MAX_SHARE:
            continue  # a model as large as the target is not a drafter
        elif other.digest is None:
            notes.append(CatalogNote(subject=subject, reason="its files could not be hashed"))
        elif len(chosen) >= MAX_DRAFTERS:
            notes.append(
                CatalogNote(subject=subject, reason=f"more than {MAX_DRAFTERS} drafters found")
            )
        else:
            chosen.append(other)
    return chosen, notes


def drafter_manifests(facts: CatalogFacts) -> tuple[list[Manifest], list[CatalogNote]]:
    """One manifest per smaller model, with a few draft lengths, the prompt cache off."""
    help_ = _help(facts, LM_RUNTIME)
    if help_ is None or "--draft-model" not in help_.flags:
        return [], [CatalogNote(subject="drafters", reason="the runtime lists no --draft-model")]
    folders, notes = drafter_folders(facts)
    if not folders:
        notes.append(
            CatalogNote(
                subject="drafters",
                reason="no model folder smaller than half the target's weights in the hub "
                "cache or the configured model_dirs",
            )
        )
    manifests = []
    ids: set[str] = set()
    for folder in folders:
        base = f"{PREFIX}draft-{_slug(folder.origin, folder.path)}"
        mid = base if base not in ids else f"{base[:56]}-{(folder.digest or '')[:6]}"
        ids.add(mid)
        manifests.append(
            Manifest(
                id=mid,
                title=f"The configured model drafted by {folder.origin or folder.path}",
                candidate_class=CandidateClass.ACCELERATION_PLUGIN,
                semantics=Semantics.LOSSLESS,
                description="Generated: a smaller model found on this machine drafts for the "
                "target; usable only when its tokenizer agrees with the target's (checked by "
                "preflight from the tokenizer files). Prompt cache off: with a drafter, "
                "mlx-lm 0.32.2's prompt cache is not lossless.",
                license_reviewed=True,
                runtime=_runtime(LM_RUNTIME, help_, ALL_PLATFORMS),
                target=_target(),
                artifacts=[ArtifactRef(role="draft", path=folder.path, digest=folder.digest)],
                resources=_memory(facts.target, folder),
                variants=[
                    Variant(
                        id=f"k{k}",
                        title=f"{k} draft tokens, prompt cache off",
                        knobs=Knobs(draft=True, num_draft_tokens=k, prompt_cache_size=0),
                    )
                    for k in DRAFT_LENGTHS
                ],
            )
        )
    return manifests, notes


def mtp_manifest(facts: CatalogFacts) -> tuple[Manifest | None, list[CatalogNote]]:
    """The model's own multi-token-prediction head, through mlx_vlm.server --draft-kind mtp,
    where its config declares MTP layers (Apple silicon only)."""
    subject = "own MTP head"
    shape = facts.target.shape
    if shape is None or not shape.mtp_layers:
        reason = "the model's config declares no multi-token-prediction layers"
        return None, [CatalogNote(subject=subject, reason=reason)]
    help_ = _help(facts, VLM_RUNTIME)
    if help_ is None:
        return None, [CatalogNote(subject=subject, reason="mlx-vlm is not installed")]
    if "mtp" not in help_.choices.get("--draft-kind", []):
        reason = f"mlx-vlm {help_.version} offers no --draft-kind mtp"
        return None, [CatalogNote(subject=subject, reason=reason)]
    blocks = [b for b in MTP_BLOCKS if "--draft-block-size" in help_.flags]
    variants = [
        Variant(
            id="mtp",
            title="its MTP head at its own block size",
            knobs=Knobs(draft=True, draft_kind="mtp"),
        )
    ]
    variants += [
        Variant(
            id=f"mtp-b{b}",
            title=f"its MTP head, block size {b}",
            knobs=Knobs(draft=True, draft_kind="mtp", draft_block_size=b),
        )
        for b in blocks
    ]
    manifest = Manifest(
        id=f"{PREFIX}mtp",
        title="The configured model drafting with its own multi-token-prediction head",
        candidate_class=CandidateClass.ACCELERATION_PLUGIN,
        semantics=Semantics.LOSSLESS,
        description=f"Generated: the config declares {shape.mtp_layers} MTP layer(s); "
        "mlx_vlm.server drafts with them (the control group a separate drafter has to beat).",
        license_reviewed=True,
        runtime=_runtime(VLM_RUNTIME, help_, APPLE),
        target=_target(),
        artifacts=[ArtifactRef(role="draft", configured=True)],
        resources=_memory(facts.target),
        variants=variants,
    )
    return manifest, []


def build_source(facts: CatalogFacts) -> tuple[FolderFacts | None, str]:
    """What builds are made from: the target when it is not quantized, else an unquantized
    model here with its architecture, shapes and tokenizer; and, when none, why."""
    target = facts.target
    if target.shape is None or target.shape.quantized is None:
        return target, ""
    found = [
        f
        for f in facts.others
        if not f.missing
        and f.digest
        and f.shape
        and f.shape.quantized is None
        and modelfacts.same_model(target, f)
    ]
    if found:
        return min(found, key=lambda f: (f.weights_bytes, f.path)), ""
    bits = target.shape.quantized.bits
    return None, (
        f"the model is quantized already ({bits or '?'}-bit {target.shape.quantized.mode}) and no "
        "source of higher precision is here (an unquantized model with its architecture, "
        "shapes and tokenizer in the hub cache or the model_dirs): a build starts from one"
    )


def _group(shape_sizes: list[int], choices: tuple[int, ...]) -> int | None:
    return next((g for g in choices if all(n % g == 0 for n in shape_sizes)), None)


def build_specs(facts: CatalogFacts, source: FolderFacts) -> tuple[list[BuildSpec], list[str]]:
    """The builds the installed converter offers for this source, and what it cannot offer."""
    help_ = _help(facts, CONVERT)
    choices = help_.choices if help_ else {}
    shape = source.shape
    sizes = [n for n in (shape.hidden_size, shape.intermediate_size) if n] if shape else []
    dtype = facts.compute_dtype if facts.compute_dtype in choices.get("--dtype", []) else None
    specs: list[BuildSpec] = []
    left: list[str] = []

    def spec(**fields: object) -> BuildSpec:
        return BuildSpec.model_validate({**fields, "dtype": dtype})

    affine = _group(sizes, (64, 32, 128))
    if affine is None:
        left.append(f"affine: no group size of 32, 64 or 128 divides the shapes {sizes}")
    else:
        group = None if affine == 64 else affine
        specs += [spec(q_bits=b, q_group_size=group) for b in AFFINE_BITS]
        mixed = next((m for m in MIXED if m in choices.get("--quant-predicate", [])), None)
        if mixed:
            specs.append(spec(quant_predicate=mixed, q_group_size=group))
    for mode in MX_MODES:
        group_size = 16 if mode == "nvfp4" else 32
        if mode not in choices.get("--q-mode", []):
            left.append(f"{mode}: mlx_lm.convert offers no --q-mode {mode}")
        elif any(n % group_size for n in sizes):
            left.append(f"{mode}: its group size {group_size} does not divide the shapes {sizes}")
        else:
            specs.append(spec(q_mode=mode))
    return specs, left


def builds_manifest(facts: CatalogFacts) -> tuple[Manifest | None, list[CatalogNote]]:
    """Quantized builds of the target (lossy), made from a source of higher precision."""
    subject = "quantized builds"
    lm = _help(facts, LM_RUNTIME)
    if lm is None or _help(facts, CONVERT) is None:
        return None, [CatalogNote(subject=subject, reason="mlx-lm's convert is not installed")]
    source, why = build_source(facts)
    if source is None:
        return None, [CatalogNote(subject=subject, reason=why)]
    specs, left = build_specs(facts, source)
    notes = [CatalogNote(subject=subject, reason=reason) for reason in left]
    if not specs:
        return None, notes
    bits = FLOAT_BITS.get((source.shape.dtype if source.shape else None) or "", 16)
    disk = max(need_bytes(spec, source.files_bytes, bits) for spec in specs)
    separate = source.path != facts.target.path
    manifest = Manifest(
        id=f"{PREFIX}builds",
        title="Quantized builds of the configured model, made in the home by mlx_lm.convert",
        candidate_class=CandidateClass.QUANTIZATION,
        semantics=Semantics.LOSSY,
        description="Generated: each variant is a build of "
        + (f"{source.origin or source.path}" if separate else "the configured model")
        + " made by `mcp-infra prepare` (or the cycle's PREPARE step) into the home, its "
        "command and hashes in the evidence. Lossy: a person approves a qualified build.",
        license_reviewed=True,
        runtime=_runtime(LM_RUNTIME, lm, ALL_PLATFORMS),
        target=_target(),
        artifacts=[ArtifactRef(role="source", path=source.path, digest=source.digest)]
        if separate
        else [],
        resources=Resources(
            memory_gb=modelfacts.memory_need_gb(facts.target.weights_bytes),
            disk_gb=round(disk / 1e9, 6),
        ),
        variants=[
            Variant(id=spec.key(), title=f"a build: {spec.describe()}", build=spec)
            for spec in specs
        ],
    )
    return manifest, notes


def generate(facts: CatalogFacts) -> tuple[list[Manifest], list[CatalogNote]]:
    """Every manifest the catalog offers for this target, and why anything is left out."""
    manifests: list[Manifest] = []
    notes: list[CatalogNote] = []
    for single in (settings_manifest, kv_manifest, builds_manifest, mtp_manifest):
        made, said = single(facts)
        manifests += [made] if made else []
        notes += said
    drafters, said = drafter_manifests(facts)
    return [*manifests, *drafters], [*notes, *said]


def candidate_count(manifests: Iterable[Manifest]) -> dict[str, int]:
    """Candidates per class, for what `init` and `registry` say."""
    counts: dict[str, int] = {}
    for manifest in manifests:
        for variant in manifest.variants:
            klass = manifest.class_of(variant).value
            counts[klass] = counts.get(klass, 0) + 1
    return counts

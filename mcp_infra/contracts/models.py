"""Model folders as facts: what a folder holds (shapes, tokenizer, weights, identity), the
model a home was initialised with, and the catalog generated for it."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field

from mcp_infra.contracts.base import REPO_PATTERN, REVISION_PATTERN, Contract, InventoryFile, Part
from mcp_infra.contracts.builds import ComputeDtype
from mcp_infra.contracts.manifest import SHA256_PATTERN, Manifest, TemplateName


class Quantized(Part):
    """How a folder's weights are already quantized (config.json ``quantization``)."""

    bits: int | None = None
    group_size: int | None = None
    mode: str = "affine"


class ModelShape(Part):
    """What config.json says about the network: the facts preflight and the catalog use."""

    model_type: str
    architectures: list[str] = Field(default_factory=list)
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_layers: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = Field(None, description="head_dim, else hidden_size / attention heads")
    vocab_size: int | None = None
    dtype: str | None = Field(None, description="torch_dtype / dtype as the config states it")
    quantized: Quantized | None = None
    mtp_layers: int = Field(
        0, description="multi-token-prediction layers the config declares (its own drafter)"
    )


class TokenizerFacts(Part):
    """A tokenizer as its files define it: two tokenizers agree when their vocabularies (every
    token and its id) and their special tokens' ids are the same, whatever they are named."""

    source: str = Field(description="the file the vocabulary was read from")
    vocab_size: int
    vocab_sha256: Annotated[str, Field(pattern=SHA256_PATTERN)]
    special: dict[str, int] = Field(
        default_factory=dict,
        description="special tokens (added tokens marked special, and the bos/eos/pad/unk "
        "roles) by content or role, with their ids",
    )


class FolderFacts(Part):
    """One model folder on this machine, as read now."""

    path: str = Field(description="the folder, symlinks resolved")
    origin: str = Field("", max_length=300, description="where it was found (hub cache, a folder)")
    missing: list[str] = Field(
        default_factory=list, description="what makes it not a model folder (empty: it is one)"
    )
    shape: ModelShape | None = None
    tokenizer: TokenizerFacts | None = None
    chat_template: bool = False
    weights_bytes: int = 0
    files_bytes: int = 0
    loaders: list[TemplateName] = Field(
        default_factory=list, description="launch templates whose runtime can load its model_type"
    )
    digest: Annotated[str, Field(pattern=SHA256_PATTERN)] | None = Field(
        None, description="sha256 over its files, where computed"
    )


class ModelSource(Part):
    """config.yaml ``model:``: what `init --model` was given and the folder it serves."""

    given: str = Field(max_length=1000, description="PATH or REPO[@REVISION] as given")
    path: str = Field(max_length=1000, description="the folder served")
    repo: Annotated[str, Field(pattern=REPO_PATTERN)] | None = None
    revision: Annotated[str, Field(pattern=REVISION_PATTERN)] | None = None
    digest: Annotated[str, Field(pattern=SHA256_PATTERN)]
    files: int = Field(ge=0)
    bytes: int = Field(ge=0)


class FolderInventory(Contract):
    """catalog/inventories/<digest>.json: every file of a local model folder with its sha256,
    so a start can say which file changed, was added or removed."""

    path: str
    files: list[InventoryFile]
    digest: Annotated[str, Field(pattern=SHA256_PATTERN)]
    recorded_at: datetime


class RuntimeHelp(Part):
    """The flags a runtime's own ``--help`` lists, for one launch template or tool."""

    name: str = Field(description="a launch template, or mlx_lm.convert")
    version: str
    flags: list[str]
    choices: dict[str, list[str]] = Field(
        default_factory=dict, description="flag → the values its help lists ({a,b,c})"
    )


class CatalogFacts(Part):
    """Everything the catalog is generated from: the target, the runtimes' --help, the other
    models on this machine, the machine's memory."""

    target: FolderFacts
    runtimes: list[RuntimeHelp] = Field(default_factory=list)
    others: list[FolderFacts] = Field(default_factory=list)
    memory_gb: float
    platform: str
    compute_dtype: ComputeDtype | None = Field(
        None, description="the dtype this machine computes a quantized build fastest in (probed)"
    )


class CatalogNote(Part):
    """Something the catalog leaves out, or lists but will not start, and why."""

    subject: str = Field(max_length=300)
    reason: str = Field(max_length=600)


class GeneratedCatalog(Contract):
    """catalog/generated.json: the manifests generated for the configured model, and the key
    of the facts they were made from (model identity, runtime versions, other models found)."""

    key: Annotated[str, Field(pattern=SHA256_PATTERN)]
    made_at: datetime
    target_digest: Annotated[str, Field(pattern=SHA256_PATTERN)]
    manifests: list[Manifest]
    notes: list[CatalogNote] = Field(default_factory=list)

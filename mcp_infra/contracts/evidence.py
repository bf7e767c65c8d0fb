"""Evidence bundles: summary, manifest, signed statement, chain, checks and cost."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from mcp_infra.contracts.base import Contract, Part
from mcp_infra.contracts.journal import Outcome
from mcp_infra.contracts.projection import PlanCost


class EnvironmentFingerprint(Contract):
    platform: str
    machine: str
    cpu: str
    cpu_count: int
    memory_gb: float
    python: str
    packages: dict[str, str]
    blas: str = ""
    accelerator: str = Field(
        "", description="what MLX computes on: 'metal: <GPU name>' or 'cpu'; empty in old bundles"
    )
    models: dict[str, str] = Field(default_factory=dict)

    def key(self) -> str:
        """What must stay equal for a remembered outcome to still apply."""
        return self.model_dump_json(include={"platform", "machine", "cpu", "packages", "models"})


class CycleSummary(Contract):
    """evidence/<id>/summary.json: the cycle's headline, for listings and `status`."""

    cycle_id: str
    plan_id: str
    started_at: datetime
    ended_at: datetime
    outcome: Outcome
    selected: str | None = None
    speedup_pct: float | None = None
    reason: str
    active_recipe: str
    interrupted: bool = False
    recovery: str | None = None


class EvidenceManifest(Contract):
    """evidence/<id>/MANIFEST.json: sha256 of every other file of the bundle."""

    cycle_id: str
    files: dict[str, str]


class DsseSignature(Part):
    keyid: str = Field(description="sha256 of the raw Ed25519 public key (its fingerprint)")
    sig: str = Field(
        description="base64 Ed25519 signature over the DSSE pre-authentication "
        "encoding of payloadType and payload"
    )


class DsseEnvelope(Part):
    """evidence/<id>/SIGNATURE.dsse.json: a DSSE envelope (secure-systems-lab/dsse v1) whose
    payload is an in-toto Statement v1. Standard field names, so other tools can read it."""

    payload_type: str = Field(alias="payloadType")
    payload: str = Field(description="base64 of the Statement's bytes")
    signatures: list[DsseSignature] = Field(min_length=1)


class StatementSubject(Part):
    name: str
    digest: dict[str, str]


class PreviousBundle(Part):
    cycle_id: str
    digest: str = Field(description="sha256 of the previous bundle's Statement (its payload)")


class EvidencePredicate(Part):
    """What the sealer vouches for beyond the file list: the chain link and digests that the
    verifier recomputes (plan content hash, every sample of every phase, the verdict)."""

    cycle_id: str
    sealed_at: datetime
    manifest_sha256: str
    previous: PreviousBundle | None = None
    plan_content_hash: str
    samples_sha256: str = Field(
        description="sha256 over the canonical JSON of every sample of "
        "every run (warm-up, measure, drift, quality, greedy, held-out) "
        "and of the online verification"
    )
    sample_counts: dict[str, int] = Field(default_factory=dict)
    verdict_sha256: str | None = None
    key_fingerprint: str
    mcp_infra_version: str = ""
    mcp_infra_commit: str | None = None


class InTotoStatement(Part):
    type_: Literal["https://in-toto.io/Statement/v1"] = Field(
        "https://in-toto.io/Statement/v1", alias="_type"
    )
    subject: list[StatementSubject]
    predicate_type: Literal["urn:mcp-infra:evidence-bundle:v1"] = Field(
        "urn:mcp-infra:evidence-bundle:v1", alias="predicateType"
    )
    predicate: EvidencePredicate


class ChainHead(Contract):
    """<home>/keys/chain.json: the newest bundle sealed by this home, so that deleting the
    latest bundle (the one no later bundle names) shows too."""

    cycle_id: str
    digest: str
    count: int = Field(ge=1)


class CheckResult(Part):
    """One named verification check of an evidence bundle."""

    name: str
    status: Literal["ok", "failed", "skipped"]
    detail: str = ""


class ServerCost(Part):
    label: str
    role: str
    pid: int
    cpu_s: float
    peak_rss_gb: float | None = None
    note: str = ""


class CycleCost(Contract):
    """evidence/<id>/cost.json: what the cycle cost, measured, with where each figure came from."""

    cycle_id: str
    wall_s: float
    phases_s: dict[str, float]
    servers: list[ServerCost] = Field(default_factory=list)
    supervisor_cpu_s: float | None = None
    downtime_s: float | None = None
    downtime_source: str = ""
    bytes_downloaded: int = 0
    bytes_note: str = ""
    energy_j: float | None = None
    energy_note: str = "not available"
    measurement_s: float = 0.0
    speedup_pct: float | None = None
    measurement_s_per_speedup_pct: float | None = None
    gain_note: str = ""
    projected: PlanCost | None = Field(
        None,
        description="what the plan was projected to cost before it ran (kept beside it as "
        "plans/<plan id>.cost.json), to set against wall_s",
    )

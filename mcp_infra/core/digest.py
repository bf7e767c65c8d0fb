"""Stable bytes and digests for hashing contracts (pure)."""

from __future__ import annotations

import hashlib
import json


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(data: object) -> bytes:
    """Stable bytes for hashing: sorted keys, no whitespace variation."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()

"""Stable bytes and digests for hashing contracts (pure)."""

from __future__ import annotations

import hashlib
import json


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(data: object, absent_when_none: frozenset[str] = frozenset()) -> bytes:
    """Stable bytes for hashing: sorted keys, no whitespace variation. Keys named in
    ``absent_when_none`` hash as absent while their value is None: fields a contract gained
    later, so a file frozen before them keeps its hash."""
    if absent_when_none:
        data = _drop_none(data, absent_when_none)
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()


def _drop_none(data: object, keys: frozenset[str]) -> object:
    if isinstance(data, dict):
        return {k: _drop_none(v, keys) for k, v in data.items() if not (k in keys and v is None)}
    if isinstance(data, list):
        return [_drop_none(v, keys) for v in data]
    return data

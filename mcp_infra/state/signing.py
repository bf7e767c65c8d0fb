"""Ed25519 keys of a home and DSSE envelopes over in-toto Statements, for evidence bundles.

The private key lives in ``<home>/keys/`` (mode 0600), never in ``evidence/``. Signing and
verifying use the ``cryptography`` library; this module only arranges bytes as the DSSE and
in-toto specifications say (PAE, base64, Statement v1).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from mcp_infra.contracts import DsseEnvelope, DsseSignature, InTotoStatement
from mcp_infra.core.digest import sha256_bytes
from mcp_infra.state.store import Home, write_bytes_atomic

PAYLOAD_TYPE = "application/vnd.in-toto+json"
PRIVATE_NAME = "evidence-ed25519.key"
PUBLIC_NAME = "evidence-ed25519.pub"


class KeyFileError(RuntimeError):
    """A key file is missing, unreadable or not an Ed25519 key."""


def keys_dir(home: Home) -> Path:
    return home.root / "keys"


def public_key_path(home: Home) -> Path:
    return keys_dir(home) / PUBLIC_NAME


def private_key_path(home: Home) -> Path:
    return keys_dir(home) / PRIVATE_NAME


def ensure_keypair(home: Home) -> Ed25519PrivateKey:
    """The home's signing key, created at the first seal (private 0600, folder 0700)."""
    path = private_key_path(home)
    if path.exists():
        return load_private(path)
    folder = keys_dir(home)
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod(folder, 0o700)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_bytes_atomic(path, private, mode=0o600)
    write_bytes_atomic(public_key_path(home), public_pem(key.public_key()))
    return key


def public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def load_private(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise KeyFileError(f"cannot read the private key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} is not an Ed25519 private key")
    return key


def load_public(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        raise KeyFileError(f"cannot read the public key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} is not an Ed25519 public key")
    return key


def fingerprint(key: Ed25519PublicKey) -> str:
    """sha256 of the raw 32-byte public key, as hex: the DSSE keyid."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return sha256_bytes(raw)


def home_fingerprint(home: Home) -> str | None:
    try:
        return fingerprint(load_public(public_key_path(home)))
    except KeyFileError:
        return None


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what is actually signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def statement_bytes(statement: InTotoStatement) -> bytes:
    return json.dumps(
        statement.model_dump(mode="json", by_alias=True), sort_keys=True, separators=(",", ":")
    ).encode()


def sign(statement: InTotoStatement, key: Ed25519PrivateKey) -> DsseEnvelope:
    payload = statement_bytes(statement)
    signature = key.sign(pae(PAYLOAD_TYPE, payload))
    return DsseEnvelope(
        payloadType=PAYLOAD_TYPE,
        payload=base64.b64encode(payload).decode(),
        signatures=[
            DsseSignature(
                keyid=fingerprint(key.public_key()), sig=base64.b64encode(signature).decode()
            )
        ],
    )


def payload_of(envelope: DsseEnvelope) -> bytes:
    return base64.b64decode(envelope.payload, validate=True)


def verify_envelope(envelope: DsseEnvelope, key: Ed25519PublicKey) -> str | None:
    """None if one signature by ``key`` verifies over the envelope's payload; else why not."""
    if envelope.payload_type != PAYLOAD_TYPE:
        return f"payloadType is {envelope.payload_type!r}, not {PAYLOAD_TYPE!r}"
    try:
        payload = payload_of(envelope)
    except ValueError as exc:
        return f"payload is not base64: {exc}"
    keyid = fingerprint(key)
    mine = [s for s in envelope.signatures if s.keyid == keyid]
    if not mine:
        return (
            f"no signature by key {keyid[:16]}… (signed by "
            f"{', '.join(s.keyid[:16] + '…' for s in envelope.signatures)})"
        )
    for item in mine:
        try:
            key.verify(base64.b64decode(item.sig, validate=True), pae(PAYLOAD_TYPE, payload))
            return None
        except (InvalidSignature, ValueError):
            continue
    return "the signature does not verify over the payload (the Statement was changed)"

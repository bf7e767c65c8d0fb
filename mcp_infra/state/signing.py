"""Ed25519 keys of a home and DSSE envelopes over in-toto Statements, for evidence bundles.

The private key lives in ``<home>/keys/`` (mode 0600), never in ``evidence/``. Signing and
verifying use the ``cryptography`` library; this module only arranges bytes as the DSSE and
in-toto specifications say (PAE, base64, Statement v1). A key's fingerprint (``fingerprint``:
SHA-256 of the raw public key, hex) is what a person publishes and pins, because a public key
file beside a bundle proves nothing about who made it (`evidence verify --fingerprint`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import tempfile
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
    return _ensure(home)[0]


def create_key_if_missing(home: Home) -> str | None:
    """Create the home's key pair if it has none; its fingerprint if this call created it (for
    the cycle to print and journal at the first seal), else None."""
    key, created = _ensure(home)
    return fingerprint(key.public_key()) if created else None


def _ensure(home: Home) -> tuple[Ed25519PrivateKey, bool]:
    """The private key is the one source of truth: it is created exclusively (two first seals at
    once end with one key, not two bundles signed by keys of which one was overwritten) and
    whole (written to a 0600 temporary file, then linked into place); the public key is derived
    from it and rewritten whenever it is missing or differs, so a crash between the two files
    never leaves a public key that verifies nothing."""
    path = private_key_path(home)
    created = False
    if not path.exists():
        folder = keys_dir(home)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(folder, 0o700)
        fresh = Ed25519PrivateKey.generate()
        created = _create_exclusive(
            path,
            fresh.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
    key = load_private(path)  # ours, or the one a concurrent first seal linked first
    pem = public_pem(key.public_key())
    public = public_key_path(home)
    try:
        current = public.read_bytes()
    except OSError:
        current = None
    if current != pem:
        write_bytes_atomic(public, pem)
    return key, created


def _create_exclusive(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` only if it does not exist, never visible half-written or
    with a mode wider than 0600; False if another writer got there first."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:  # mkstemp creates the file 0600
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: exclusive, if not crash-whole
            try:
                out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                return False
            with os.fdopen(out, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
    finally:
        Path(tmp).unlink(missing_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)  # the new name itself survives a power cut
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return True


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


# load_private's twin: the loader and the key type it must return differ.
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
    return fingerprint_of_raw(
        key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )


def fingerprint_of_raw(public_key_bytes: bytes) -> str:
    """The fingerprint of a raw 32-byte Ed25519 public key: 64 hex digits of its SHA-256."""
    return sha256_bytes(public_key_bytes)


def short_fingerprint(full: str) -> str:
    """The first 16 hex digits, for a person to compare at a glance (pin the full one)."""
    return f"{full[:16]}…"


_HEX64 = re.compile(r"[0-9a-f]{64}")


def parse_fingerprint(text: str) -> str:
    """A fingerprint as a person may paste it (any case, ``sha256:`` prefix, colons or spaces
    between groups) in the form ``fingerprint`` returns; ValueError if it is not one."""
    value = text.strip().lower().removeprefix("sha256:")
    value = re.sub(r"[\s:]", "", value)
    if not _HEX64.fullmatch(value):
        raise ValueError(
            f"{text[:80]!r} is not a key fingerprint: pass all 64 hex digits of SHA-256 over "
            "the raw Ed25519 public key, as `mcp-infra evidence export` and `status` print it"
        )
    return value


def verify_command(ref: str, full: str, key: Path | str | None = None) -> str:
    """The command that verifies a bundle against this fingerprint (``key``: for a copy away
    from the home that sealed it, the public key file beside it)."""
    with_key = f" --key {shlex.quote(str(key))}" if key is not None else ""
    return f"mcp-infra evidence verify {shlex.quote(ref)}{with_key} --fingerprint {full}"


def home_fingerprint(home: Home) -> str | None:
    """The home's key fingerprint, or None if it has no key yet. Read from the public key, or
    derived from the private one while a first seal is between writing the two."""
    for path, load in (
        (public_key_path(home), load_public),
        (private_key_path(home), lambda p: load_private(p).public_key()),
    ):
        try:
            return fingerprint(load(path))
        except KeyFileError:
            continue
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
        payload_type=PAYLOAD_TYPE,
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

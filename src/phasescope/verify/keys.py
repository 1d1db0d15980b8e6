"""Ed25519 signing keys: generated on first use, stored owner-only (0600), named.

A key lives in `$PHASESCOPE_HOME/keys/NAME.key` (else `$XDG_DATA_HOME/phasescope/keys`, ~/.local/share)
as unencrypted PKCS#8 PEM, with its public half beside it in `NAME.pub`. A key file readable by group or
others is refused rather than used: a signature is only worth the secrecy of its key. So is a key
directory writable by group or others: whoever can write there can put their own key (or a link) under
the key's name, and the bundles would be signed with it.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from phasescope.errors import InputError

DEFAULT_KEY = "default"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def key_dir() -> Path:
    home = os.environ.get("PHASESCOPE_HOME")
    if home:
        return Path(home) / "keys"
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "phasescope" / "keys"


def key_path(name: str, directory: Path | None = None) -> Path:
    if not _NAME.match(name):
        raise InputError("--key", "name", "letters, digits, '.', '_' or '-' (at most 64)", name)
    return (directory or key_dir()) / f"{name}.key"


def load_or_create(name: str = DEFAULT_KEY, directory: Path | None = None) -> tuple[Ed25519PrivateKey, Path]:
    """The named private key, generated (0600) when it does not exist yet."""
    path = key_path(name, directory)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = path.parent.stat().st_mode & 0o777
    if mode & 0o022:
        raise InputError(
            path.parent, "permissions", "a key directory writable by the owner only (0700)", oct(mode)
        )
    if not path.exists():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        # O_EXCL: never overwrite a key another process has just made; the mode applies at creation.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if not path.exists():  # a link to nothing: O_EXCL refuses to follow it, and so do we
                raise InputError(
                    path, "key", "a key file, not a symbolic link", f"a dangling link to {os.readlink(path)}"
                ) from None
            return load_or_create(name, directory)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        path.with_suffix(".pub").write_text(public_pem(key.public_key()), encoding="ascii")
        return key, path
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise InputError(path, "permissions", "0600 (readable by the owner only)", oct(mode))
    try:
        loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise InputError(path, "key", "an unencrypted Ed25519 private key (PEM)", str(exc)[:60]) from None
    if not isinstance(loaded, Ed25519PrivateKey):
        raise InputError(path, "key", "an Ed25519 private key", type(loaded).__name__)
    return loaded, path


def public_pem(key: Ed25519PublicKey) -> str:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(key: Ed25519PublicKey) -> str:
    return "sha256:" + hashlib.sha256(raw_public(key)).hexdigest()[:32]


def parse_public(text: str, where: str) -> Ed25519PublicKey:
    """A public key from PEM text."""
    try:
        key = serialization.load_pem_public_key(text.encode("ascii", errors="replace"))
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise InputError(where, "public key", "an Ed25519 public key (PEM)", str(exc)[:60]) from None
    if not isinstance(key, Ed25519PublicKey):
        raise InputError(where, "public key", "an Ed25519 public key", type(key).__name__)
    return key


def load_public(path: str | Path) -> Ed25519PublicKey:
    p = Path(path)
    if not p.is_file():
        raise InputError(p, "public key", "a PEM file (e.g. NAME.pub beside the key)", "no such file")
    return parse_public(p.read_text(encoding="ascii", errors="replace"), str(p))

from __future__ import annotations

import os
from pathlib import Path

import pytest

from phasescope.errors import InputError
from phasescope.verify.keys import fingerprint, load_or_create, load_public


def test_key_is_generated_once_with_owner_only_permissions(tmp_path: Path) -> None:
    key, path = load_or_create("site-a", tmp_path)
    assert path == tmp_path / "site-a.key"
    assert path.stat().st_mode & 0o777 == 0o600
    again, _ = load_or_create("site-a", tmp_path)
    assert fingerprint(again.public_key()) == fingerprint(key.public_key())
    pub = load_public(path.with_suffix(".pub"))
    assert fingerprint(pub) == fingerprint(key.public_key())
    other, _ = load_or_create("site-b", tmp_path)  # a key can be named: another name, another key
    assert fingerprint(other.public_key()) != fingerprint(key.public_key())


def test_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    _, path = load_or_create("k", tmp_path)
    os.chmod(path, 0o644)
    with pytest.raises(InputError, match=r"k\.key: permissions: expected 0600"):
        load_or_create("k", tmp_path)


def test_bad_key_name_and_damaged_key(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--key: name"):
        load_or_create("../etc/passwd", tmp_path)
    bad = tmp_path / "broken.key"
    bad.write_text("not a key")
    os.chmod(bad, 0o600)
    with pytest.raises(InputError, match=r"broken\.key: key: expected an unencrypted Ed25519 private key"):
        load_or_create("broken", tmp_path)
    with pytest.raises(InputError, match="public key"):
        load_public(tmp_path / "missing.pub")


@pytest.mark.parametrize("mode", [0o770, 0o777, 0o722])
def test_key_directory_writable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    """Whoever can write to the directory can put their own key under the name, and sign as the owner."""
    d = tmp_path / "keys"
    load_or_create("k", d)
    os.chmod(d, mode)
    refused = r"keys: permissions: expected a key directory writable by the owner only"
    with pytest.raises(InputError, match=refused):
        load_or_create("k", d)
    with pytest.raises(InputError, match="writable by the owner only"):
        load_or_create("new", d)  # nor is a new key written there
    assert not (d / "new.key").exists()
    os.chmod(d, 0o755)  # readable by others is fine: only the key file is secret
    load_or_create("k", d)


def test_a_dangling_link_at_the_key_name_is_refused(tmp_path: Path) -> None:
    (tmp_path / "k.key").symlink_to(tmp_path / "elsewhere.key")
    with pytest.raises(InputError, match=r"k\.key: key: expected a key file, not a symbolic link"):
        load_or_create("k", tmp_path)
    assert not (tmp_path / "elsewhere.key").exists()

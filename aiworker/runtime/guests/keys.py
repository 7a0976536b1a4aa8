"""Ed25519 key pairs in OpenSSH format: a guest's host key and the control link's client
key, generated per provisioning and never shipped."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def new_key_pair(private_path: Path, comment: str) -> str:
    """Write a new private key to PRIVATE_PATH (0600) and its public line beside it
    (.pub); return the public line."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(private)
    line = f"{public.decode()} {comment}"
    Path(f"{private_path}.pub").write_text(line + "\n")
    return line

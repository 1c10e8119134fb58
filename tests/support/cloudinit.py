"""cloud-init's own JSON schema for ``#cloud-config``, to validate the user data we send.

cloud-init is not on PyPI; Debian packages it. The schema is taken from an installed
cloud-init, or else from the Debian package fetched with ``apt-get download`` (no install,
nothing runs) and unpacked into a cache. A machine that has neither fails the test that
asks for it: validating against a guess of the schema would prove nothing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

_SCHEMA = "usr/lib/python3/dist-packages/cloudinit/config/schemas/schema-cloud-config-v1.json"
_CACHE = Path.home() / ".cache" / "skyward-tests" / "cloud-init"


def schema() -> dict[str, Any]:
    installed = Path("/") / _SCHEMA
    if installed.exists():
        return dict(json.loads(installed.read_text()))
    unpacked = _CACHE / "root" / _SCHEMA
    if not unpacked.exists():
        _CACHE.mkdir(parents=True, exist_ok=True)
        for old in _CACHE.glob("cloud-init_*.deb"):
            old.unlink()
        download = ["apt-get", "download", "-q", "cloud-init"]
        if subprocess.run(download, cwd=_CACHE, capture_output=True, timeout=120).returncode:
            # A fresh machine has no package lists yet.
            subprocess.run(["apt-get", "update", "-qq"], check=True, timeout=300)
            subprocess.run(download, cwd=_CACHE, check=True, capture_output=True, timeout=120)
        (package,) = _CACHE.glob("cloud-init_*.deb")
        subprocess.run(
            ["dpkg-deb", "-x", str(package), str(_CACHE / "root")], check=True, timeout=60
        )
    return dict(json.loads(unpacked.read_text()))


def known_keys(document: dict[str, Any]) -> set[str]:
    """Every top-level key some cloud-init module documents (the schema itself lets unknown
    keys through, so a misspelt key would otherwise pass)."""
    keys: set[str] = set()
    for definition in document["$defs"].values():
        keys.update(definition.get("properties", {}))
    return keys

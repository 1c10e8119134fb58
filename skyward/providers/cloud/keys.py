"""Pool keys left on this machine, and whose they are: what ``skyward ls`` / ``down`` show
and remove besides the clouds' resources.

A cloud provider labels its pool's login key (``PoolKey.label``, ``key_label``) with the
provider, region, pool and the name of what it made (key pair, rule base, resource group);
a client that ends normally deletes the key with its allocation, so a key found here
belongs to a running pool or to a client that was killed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LocalKey:
    """A pool key left on this machine (``/tmp/skyward-key-*``) and whose it is, from the
    ``about.json`` its provider wrote beside it (``PoolKey.label``)."""

    directory: Path
    provider: str
    region: str
    pool: str
    key_pair: str
    endpoint: str = ""  # the API endpoint the pool was made through ("" for the cloud's own)
    pid: int = 0  # the client that made it

    @property
    def client_alive(self) -> bool:
        """Whether the client that made it still runs (then the key is in use)."""
        if self.pid <= 0:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def key_label(
    provider: str, region: str, pool: str, key_pair: str, endpoint: str
) -> dict[str, str]:
    """What a provider writes beside its pool key (``PoolKey.label``)."""
    return {
        "provider": provider,
        "region": region,
        "pool": pool,
        "key_pair": key_pair,
        "endpoint": endpoint,
        "pid": str(os.getpid()),
    }


def local_keys(root: Path | None = None) -> list[LocalKey]:
    """Every labelled pool key under ``root`` (default: the temporary directory). A client
    that ends normally deletes its own; those found belong to running pools or to clients
    that were killed."""
    from skyward.providers.ssh.connection import ABOUT_FILE, KEY_PREFIX

    found: list[LocalKey] = []
    for directory in sorted((root or Path(tempfile.gettempdir())).glob(f"{KEY_PREFIX}*")):
        try:
            about = json.loads((directory / ABOUT_FILE).read_text())
            found.append(
                LocalKey(
                    directory,
                    str(about["provider"]),
                    str(about["region"]),
                    str(about["pool"]),
                    str(about["key_pair"]),
                    str(about.get("endpoint", "")),
                    int(about.get("pid", 0)),
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unlabelled (an older client) or being written: not ours to judge
    return found


def remove_local_key(key: LocalKey) -> None:
    shutil.rmtree(key.directory, ignore_errors=True)

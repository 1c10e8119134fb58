"""Vast.ai's line in ``skyward doctor``: where the API key is, read from the environment and
the ``vastai`` CLI's files only (``providers/credentials.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from skyward.providers.credentials import Check
from skyward.providers.vastai.api import KEYS_PAGE, find_key, key_files


def check(env: Mapping[str, str], home: Path) -> Check:
    found = find_key(env, home)
    if found is not None:
        return Check("Vast.ai API key", "ok", f"in {found[1]}")
    places = ", ".join(str(p) for p in key_files(env, home))
    fix = f"set VAST_API_KEY, or run `vastai set api-key KEY` (a key from {KEYS_PAGE})"
    return Check("Vast.ai API key", "missing", f"none found (VAST_API_KEY, {places})", fix)

"""Verda's line in ``skyward doctor``: whether an API key's client credentials are set (read
from the environment only; ``providers/credentials.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from skyward.providers.credentials import Check


def check(env: Mapping[str, str], home: Path) -> Check:
    if env.get("VERDA_CLIENT_ID") and env.get("VERDA_CLIENT_SECRET"):
        return Check("Verda credentials", "ok", "VERDA_CLIENT_ID and VERDA_CLIENT_SECRET")
    fix = "create an API key at console.verda.com; set VERDA_CLIENT_ID and VERDA_CLIENT_SECRET"
    return Check("Verda credentials", "missing", "VERDA_CLIENT_ID / VERDA_CLIENT_SECRET unset", fix)

"""Lambda Cloud's line in ``skyward doctor``: where the API key would be found, read from the
environment and ``~/.lambda_cloud/lambda_keys`` only (``providers/credentials.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from skyward.providers.credentials import Check
from skyward.providers.lambdacloud.api import KEYS_PAGE, api_key


def check(env: Mapping[str, str], home: Path) -> Check:
    found = api_key(None, env, home)
    if found is None:
        fix = f"make a key at {KEYS_PAGE} and set LAMBDA_API_KEY"
        return Check("Lambda Cloud API key", "missing", "none found (LAMBDA_API_KEY)", fix)
    return Check("Lambda Cloud API key", "ok", f"from {found[1]}")

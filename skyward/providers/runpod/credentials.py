"""RunPod's line in ``skyward doctor``: where a RunPod API key would be found, from the
environment and ``~/.runpod/config.toml`` only (``providers/credentials.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from skyward.providers.credentials import Check


def check(env: Mapping[str, str], home: Path) -> Check:
    from skyward._errors import ProvisionError
    from skyward.providers.runpod.api import ENV, api_key, config_file

    if env.get(ENV):
        return Check("RunPod API key", "ok", f"{ENV} is set")
    try:
        api_key(None, env, home)
    except ProvisionError:
        fix = (
            f"set {ENV}, or run `runpod config` (keys: https://www.runpod.io/console/user/settings)"
        )
        return Check("RunPod API key", "missing", f"none found ({ENV}, {config_file(home)})", fix)
    return Check("RunPod API key", "ok", f"in {config_file(home)}")

"""Azure's line in ``skyward doctor``: a service principal in the environment or an Azure CLI
login, and the subscription, read from the environment and files only
(``providers/credentials.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from skyward.providers.credentials import Check


def check(env: Mapping[str, str], home: Path) -> Check:
    fix = "run `az login`, or set AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET"
    subscription = env.get("AZURE_SUBSCRIPTION_ID")
    where = f"subscription {subscription}" if subscription else "no AZURE_SUBSCRIPTION_ID set"
    secret = ("AZURE_CLIENT_SECRET", "AZURE_CLIENT_CERTIFICATE_PATH", "AZURE_FEDERATED_TOKEN_FILE")
    principal = env.get("AZURE_CLIENT_ID") and env.get("AZURE_TENANT_ID")
    if principal and any(env.get(s) for s in secret):
        return Check("Azure credentials", "ok", f"service principal from environment; {where}")
    cli = Path(env.get("AZURE_CONFIG_DIR") or home / ".azure")
    if (cli / "msal_token_cache.json").is_file() or (cli / "msal_token_cache.bin").is_file():
        return Check("Azure credentials", "ok", f"Azure CLI login in {cli}; {where}")
    return Check("Azure credentials", "missing", f"none found (environment, {cli})", fix)

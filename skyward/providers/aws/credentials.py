"""AWS's line in ``skyward doctor``: where boto3 would find credentials and a region, read
from the environment and the shared files only (``providers/credentials.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from skyward.providers.credentials import Check, read_ini


def check(env: Mapping[str, str], home: Path) -> Check:
    fix = (
        "run `aws configure` (or `aws sso login`), "
        "or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    )
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    credentials = Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials")
    config = Path(env.get("AWS_CONFIG_FILE") or home / ".aws" / "config")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    config_section = "default" if profile == "default" else f"profile {profile}"
    parsed_config = read_ini(config)
    if not region:
        region = parsed_config.get(config_section, "region", fallback=None)
    where = f"region {region}" if region else "no region set (AWS_DEFAULT_REGION)"
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return Check("AWS credentials", "ok", f"from environment variables; {where}")
    if read_ini(credentials).has_section(profile):
        return Check("AWS credentials", "ok", f"profile {profile!r} in {credentials}; {where}")
    section = parsed_config
    keys = ("aws_access_key_id", "sso_session", "sso_start_url", "credential_process", "role_arn")
    if section.has_section(config_section) and any(
        section.has_option(config_section, k) for k in keys
    ):
        return Check("AWS credentials", "ok", f"profile {profile!r} in {config}; {where}")
    return Check(
        "AWS credentials",
        "missing",
        f"none found for profile {profile!r} (environment, {credentials}, {config})",
        fix,
    )

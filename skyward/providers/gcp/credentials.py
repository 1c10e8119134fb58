"""GCP's line in ``skyward doctor``: where Google's clients would find credentials and a
project, read from the environment and gcloud's files only (``providers/credentials.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from skyward.providers.credentials import Check, read_ini, read_text


def check(env: Mapping[str, str], home: Path) -> Check:
    fix = "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS"
    gcloud = Path(env.get("CLOUDSDK_CONFIG") or home / ".config" / "gcloud")
    project = env.get("GOOGLE_CLOUD_PROJECT") or env.get("CLOUDSDK_CORE_PROJECT")
    if not project:
        active = read_text(gcloud / "active_config").strip() or "default"
        project = read_ini(gcloud / "configurations" / f"config_{active}").get(
            "core", "project", fallback=None
        )
    where = f"project {project}" if project else "no project set (GOOGLE_CLOUD_PROJECT)"
    named = env.get("GOOGLE_APPLICATION_CREDENTIALS")
    if named:
        if Path(named).is_file():
            detail = f"GOOGLE_APPLICATION_CREDENTIALS={named}; {where}"
            return Check("GCP credentials", "ok", detail)
        return Check(
            "GCP credentials",
            "missing",
            f"GOOGLE_APPLICATION_CREDENTIALS names {named}, which does not exist",
            fix,
        )
    adc = gcloud / "application_default_credentials.json"
    if adc.is_file():
        return Check("GCP credentials", "ok", f"application default credentials in {adc}; {where}")
    return Check("GCP credentials", "missing", f"none found (environment, {adc})", fix)

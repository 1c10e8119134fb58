"""Helpers for the Azure provider's tests: ``sky.Azure`` pointed at the fake ARM server, what
the fake holds for a pool, and a fake ``az`` for the processes that sign in the way a user
does (``skyward ls`` / ``down``, a client killed on purpose)."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

import skyward as sky
from support.clouds.azure.fake import SUBSCRIPTION, TOKEN, AzureFake, FakeCredential
from support.clouds.azure.standins import AzureStandIns
from support.sshhosts import USER

LOCATION = "eastus"


def provider(fake: AzureFake, **options: Any) -> sky.Azure:
    """``sky.Azure`` against ``fake``: its URL and CA, no waiting between polls, a fixed SSH
    range (no public-address lookup), unless ``options`` say otherwise."""
    settings: dict[str, Any] = {
        "subscription_id": SUBSCRIPTION,
        "location": LOCATION,
        "credential": FakeCredential(),
        "base_url": fake.url,
        "connection_verify": fake.ca_path,
        "poll_interval": 0,
        "ssh_cidr": "10.123.0.0/16",
        "release_timeout": 30.0,
        **options,
    }
    return sky.Azure(**settings)


def groups_of(fake: AzureFake, pool: str) -> list[str]:
    """The resource groups the fake holds for ``pool`` (by its tag)."""
    return [
        g["name"]
        for g in fake.resource_groups()
        if (g.get("tags") or {}).get("skyward-pool") == pool
    ]


def only_group(fake: AzureFake, pool: str) -> str:
    (group,) = groups_of(fake, pool)
    return group


def wait_until(condition: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.05)


def fake_az(directory: Path) -> Path:
    """A directory holding an ``az`` that prints a token as ``az account get-access-token``
    does: with ``AZURE_TOKEN_CREDENTIALS=AzureCliCredential``, ``DefaultAzureCredential`` asks
    only it, the way it asks a user's real ``az`` after ``az login``."""
    directory.mkdir(parents=True, exist_ok=True)
    answer = json.dumps(
        {
            "accessToken": TOKEN,
            "expiresOn": "2099-01-01 00:00:00.000000",
            "expires_on": 4070908800,
            "subscription": SUBSCRIPTION,
            "tenant": "00000000-0000-0000-0000-000000000000",
            "tokenType": "Bearer",
        }
    )
    script = directory / "az"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{answer}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory


def signed_in_env(fake: AzureFake, az_directory: Path) -> dict[str, str]:
    """The environment of a process that signs in through ``az`` and trusts the fake's CA."""
    return {
        **os.environ,
        "PATH": f"{fake_az(az_directory)}:{os.environ.get('PATH', '')}",
        "AZURE_TOKEN_CREDENTIALS": "AzureCliCredential",
        "AZURE_SUBSCRIPTION_ID": SUBSCRIPTION,
        "REQUESTS_CA_BUNDLE": fake.ca_path,
    }


def skyward_cli() -> str:
    return str(Path(sys.executable).parent / "skyward")


def standin_provider(cloud: AzureStandIns, **options: Any) -> sky.Azure:
    """``sky.Azure`` for the stand-ins: reached at private addresses, logging in as the test
    hosts' user."""
    assert cloud.fake is not None
    settings: dict[str, Any] = {"connect": "private", "username": USER, **options}
    return provider(cloud.fake, **settings)

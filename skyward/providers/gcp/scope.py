"""What GCP adds to ``skyward ls`` / ``down`` (``providers/scope.py``): ``--project`` (by
default the application-default credentials' project). The Compute calls go to
``SKYWARD_GCP_ENDPOINT`` when it is set (a proxy or a test server). A GCP pool has no key
pair: its pool key is in use while resources named after it remain.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from skyward._errors import SkywardError
from skyward.providers.scope import Flag, Given, Places, Scope, any_present

if TYPE_CHECKING:
    from skyward.providers.base import Inventory, Leftover
    from skyward.providers.cloud.keys import LocalKey


class GCPScope(Scope):
    flags = (
        Flag("--project", "projects", "A GCP project to look in (repeatable).", multiple=True),
    )
    cloud = True

    def given(self, options: Given) -> bool:
        return bool(options.many("projects"))

    def configured(self) -> bool:
        # Application Default Credentials' places, gcloud's configuration, a project or an
        # endpoint named; a VM's service account alone is not seen (name the cloud there).
        gcloud = os.environ.get("CLOUDSDK_CONFIG", "~/.config/gcloud")
        return any_present(
            (
                "GOOGLE_APPLICATION_CREDENTIALS",
                "GOOGLE_CLOUD_PROJECT",
                "CLOUDSDK_CORE_PROJECT",
                "SKYWARD_GCP_ENDPOINT",
            ),
            (f"{gcloud}/application_default_credentials.json", f"{gcloud}/configurations"),
        )

    def places(self, options: Given) -> Places:
        if importlib.util.find_spec("google.cloud.compute_v1") is None:
            return Places(
                unchecked=["gcp: not checked; install it with: pip install 'skyward[gcp]'"]
            )
        from skyward.providers.gcp import GCP
        from skyward.providers.gcp.api import credentials_and_project

        places = Places()
        endpoint = os.environ.get("SKYWARD_GCP_ENDPOINT") or None
        asked_for: list[str | None] = list(options.many("projects")) or [None]
        for asked in asked_for:
            try:
                credentials, project = credentials_and_project(asked, None)
            except SkywardError as exc:
                places.unchecked.append(f"gcp: not checked: {exc}")
                continue
            config = GCP(project=project, credentials=credentials, endpoint=endpoint)
            inventory = config.inventory()
            if inventory is not None:
                places.found.append((f"gcp {project}", inventory))
        return places

    def advice(self, text: str) -> str:
        text = re.sub(r"sky\.GCP\(project='([^']*)'\)", r"--project \1", text)
        # The command has no flag for a credentials file: its variable is already named.
        return re.sub(
            r", set (GOOGLE_APPLICATION_CREDENTIALS[^,]*), or pass sky\.GCP\(credentials=\.\.\.\)",
            r" or set \1",
            text,
        )

    def judges(self, key: LocalKey, options: Given, searched: Sequence[Inventory]) -> bool:
        return key.endpoint == os.environ.get("SKYWARD_GCP_ENDPOINT", "")

    def holds(self, key: LocalKey, leftovers: Sequence[Leftover]) -> bool:
        return any(x.provider == "gcp" and x.id.startswith(key.key_pair) for x in leftovers)


SCOPE = GCPScope()

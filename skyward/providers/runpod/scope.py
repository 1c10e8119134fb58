"""What RunPod adds to ``skyward ls`` / ``down`` (``providers/scope.py``): the account of the
API key (``RUNPOD_API_KEY``, ``~/.runpod/config.toml``); no flags, one account per key. The
calls go to ``SKYWARD_RUNPOD_ENDPOINT`` when it is set (a proxy or a test server)."""

from __future__ import annotations

import os

from skyward._errors import SkywardError
from skyward.providers.scope import Given, Places, Scope


class RunPodScope(Scope):
    flags = ()
    cloud = True

    def given(self, options: Given) -> bool:
        return False

    def places(self, options: Given) -> Places:
        from skyward.providers.runpod import RunPod
        from skyward.providers.runpod.api import api_key

        try:
            key = api_key(None)
        except SkywardError as exc:
            return Places(unchecked=[f"runpod: not checked: {exc}"])
        endpoint = os.environ.get("SKYWARD_RUNPOD_ENDPOINT") or None
        inventory = RunPod(api_key=key, endpoint_url=endpoint).inventory()
        return Places(found=[("runpod account", inventory)] if inventory else [])


SCOPE = RunPodScope()

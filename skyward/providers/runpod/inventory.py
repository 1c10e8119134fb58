"""What Skyward left on one RunPod account, and its removal (``skyward ls`` / ``down``).

A pod has no labels: Skyward's pods are found by their ``skyward-`` names and the pool's
tags they carry in their environment (``SKYWARD_TAGS``). A stopped pod (its watchdog ended
it) is listed too: it bills its volume until it is terminated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from skyward.client.futures import Deadline
from skyward.providers.base import TAG_POOL, Leftover
from skyward.providers.cloud.inventory import CloudInventory
from skyward.providers.runpod import api as runpod
from skyward.providers.runpod.api import Api
from skyward.providers.runpod.machines import TAGS_ENV


class RunPodInventory(CloudInventory[Api]):
    """Leftovers on one account."""

    provider = "runpod"
    kinds = ("pod",)

    @property
    def where(self) -> str:
        return "the RunPod account"

    def leftovers(self, *, pool: str | None = None) -> list[Leftover]:
        found = []
        for pod in runpod.pods(self.api):
            env = pod.get("env") or {}
            if not str(pod.get("name") or "").startswith("skyward-") or TAGS_ENV not in env:
                continue
            tags = json.loads(env[TAGS_ENV])
            if pool is not None and tags.get(TAG_POOL) != pool:
                continue
            status = str(pod.get("desiredStatus") or "unknown")
            hourly = (
                float(pod["costPerHr"]) if status == "RUNNING" and pod.get("costPerHr") else None
            )
            where = str(pod.get("name"))  # the name says which node of which pool it was
            found.append(
                self.leftover(
                    "pod", str(pod["id"]), tags, region=where, state=status.lower(), hourly=hourly
                )
            )
        return found

    def remove(self, by_kind: Mapping[str, list[Leftover]], deadline: Deadline) -> list[str]:
        return runpod.terminate(self.api, [pod.id for pod in by_kind["pod"]])

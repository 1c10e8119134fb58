"""Helpers for the Lambda tests: a provider pointed at the fake, what the fake holds for a
pool, and stand-in VMs for the fake's instances.

::

    LambdaFake on the test bridge       LambdaStandIns (a thread in the test process, reading it)
    ─────────────────────────────       ──────────────────────────────────────────────────────
    an instance's addresses from the    an "active" instance at one of them, not yet booted ─>
      plan: 10.123.N.200, ...             boot a stand-in (the AWS stand-in's machine side) from
                                          its ``user_data``, with the public keys its
                                          ``ssh_key_names`` name, as Lambda's image installs them
                                        a stand-in that powered itself off ─> the fake keeps the
                                          instance (and bills it), as Lambda does
                                        an instance terminating or gone ─> stop its stand-in
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, cast

import yaml

import skyward as sky
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.standins import StandIn, StandInCloud
from support.clouds.lambdacloud.fake import KEY, LambdaFake
from support.sshhosts import USER, Hosts

REGION = "us-east-1"
FIRST_STANDIN = 200  # stand-ins take .200 and up of the hosts' subnet


def provider(fake: LambdaFake, **options: Any) -> sky.Lambda:
    """``sky.Lambda`` against the fake, with a fixed SSH range (no public-address lookup)."""
    settings: dict[str, Any] = {
        "api_key": KEY,
        "endpoint_url": fake.url,
        "ssh_cidr": "10.123.0.0/16",
        "release_timeout": 30.0,
        **options,
    }
    return sky.Lambda(**settings)


def standin_provider(cloud: LambdaStandIns, **options: Any) -> sky.Lambda:
    """``sky.Lambda`` for the stand-ins: reached at private addresses, as the hosts' user."""
    return provider(cloud.fake, connect="private", username=USER, **options)


def held(fake: LambdaFake, pool: str) -> dict[str, list[str]]:
    """What the fake still holds for ``pool``, found as ``skyward ls`` finds it: instances
    not terminated (by their tag), and the rulesets and SSH keys named after their pool."""
    instances = [
        i
        for i in fake.listed()
        if i["status"] != "terminated"
        and {"key": "skyward-pool", "value": pool} in (i.get("tags") or [])
    ]
    bases = {t["value"] for i in instances for t in i["tags"] if t["key"] == "skyward-name"}
    slug = f"skyward-{pool}-"
    with fake._lock:
        rulesets = [r["name"] for r in fake.rulesets.values() if _ours(r["name"], slug, bases)]
        keys = [k["name"] for k in fake.keys.values() if _ours(k["name"], slug, bases)]
    return {"instances": [i["id"] for i in instances], "rulesets": rulesets, "ssh keys": keys}


def _ours(name: str, slug: str, bases: set[str]) -> bool:
    return name in bases or (name.startswith(slug) and len(name) == len(slug) + 6)


def nothing(holdings: dict[str, list[str]]) -> bool:
    return not any(holdings.values())


@dataclass
class LambdaStandIns(StandInCloud):
    """The fake plus stand-ins for its instances: ``standins.StandInCloud``'s machine side,
    with Lambda in place of moto. Use as a context manager."""

    fake: LambdaFake = None  # type: ignore[assignment]  # given by start()
    planned: dict[str, str] = field(default_factory=dict)  # address -> region

    def __post_init__(self) -> None:  # no moto here: the fake is the cloud
        self.fake.address_plan = self._plan
        self._next = FIRST_STANDIN  # and planned: guarded by _lock
        self._start("lambda")

    @classmethod
    def start(cls, fake: LambdaFake, hosts: Hosts, **options: Any) -> LambdaStandIns:
        return cls(moto=cast(MotoServer, None), hosts=hosts, fake=fake, **options)

    def _plan(self, region: str, index: int) -> tuple[str, str]:
        with self._lock:
            address = f"{self.hosts.subnet}.{self._next}"
            self._next = FIRST_STANDIN if self._next >= 250 else self._next + 1
            self.planned[address] = region
        return address, address  # the public and the private address: one bridge here

    # ── the cloud's side ───────────────────────────────────────────────────────────────

    def _step(self) -> None:
        instances = {i["id"]: i for i in self.fake.listed() if i.get("private_ip") in self.planned}
        for id, instance in instances.items():
            with self._lock:
                standin = self.standins.get(id)
            status = instance["status"]
            if status == "active" and standin is None and self.boot:
                standin = self._claim(instance)
                threading.Thread(target=self._boot, args=(standin, instance), daemon=True).start()
            elif status in ("terminating", "terminated") and standin and not standin.ended:
                standin.ended = "terminated"
                self._remove(standin)
                self._event("terminated-by-cloud", id)
        self._reap(self._power_off)

    def _power_off(self, standin: StandIn) -> None:
        """What Lambda does when a guest halts: the instance is kept, and billed."""
        self.fake.power_off(standin.instance)
        self._event("powered-off-kept", standin.instance)

    # ── a machine's side ───────────────────────────────────────────────────────────────

    def _claim(self, instance: dict[str, Any]) -> StandIn:
        return self._new_standin(instance["id"], instance["private_ip"], "l")

    def _user_data(self, instance: str) -> dict[str, Any]:
        text = self.fake.user_data(instance)
        return dict(yaml.safe_load(text) or {}) if text.startswith("#cloud-config") else {}

    def _key_pair(self, name: str) -> str:
        with self.fake._lock:
            (key,) = [k["public_key"] for k in self.fake.keys.values() if k["name"] == name]
        return str(key)

    def _boot(self, standin: StandIn, instance: dict[str, Any]) -> None:
        # The key Lambda installs is the one ``ssh_key_names`` names: as EC2's key pair.
        super()._boot(standin, {**instance, "KeyName": instance["ssh_key_names"][0]})

    def close(self) -> None:
        super().close()
        self.fake.address_plan = None

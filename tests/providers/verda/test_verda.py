"""The Verda provider against the fake of Verda's REST API (real HTTP, Verda's own JSON and
error shapes, instances through their states over several polls): the token, what it asks
Verda for, what it says when Verda refuses, how it moves to another location, type or
market, and that an interrupted or failed start leaves nothing behind (instances, OS
volumes, the SSH key, the startup script). Reaching the instances over SSH is in
``test_verda_standins.py``."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from pydantic import ValidationError
from support.clouds.aws.pools import Checkpoint, request
from support.clouds.verda.fake import CLIENT_ID, CLIENT_SECRET, VerdaFake
from support.clouds.verda.standins import held, nothing, provider
from support.dispositions import as_from_a_terminal
from support.reporter import Recorder

import skyward as sky
from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.client.phases import SilentReporter
from skyward.providers.cloud.boot import WATCHDOG_PATH
from skyward.providers.cloud.capacity import CapacityError
from skyward.providers.cloud.contract import Want
from skyward.providers.cloud.start import CloudPool
from skyward.providers.verda.api import Api

pytestmark = pytest.mark.timeout(120)


def _stopped_at(fake: VerdaFake, step: str, pool: str, **options: Any) -> dict[str, Any]:
    """Provision ``pool`` until ``step`` (a Ctrl-C there); what the fake held then."""
    seen: dict[str, Any] = {}
    settings = {k: options.pop(k) for k in list(options) if k in ("accelerator", "nodes")}
    made = request(
        pool=pool,
        deadline=Checkpoint(step, reached=lambda: seen.update(held=held(fake, pool))),
        **settings,
    )
    with pytest.raises(KeyboardInterrupt):
        provider(fake, **options).provision(made, seen.setdefault("recorder", Recorder()))
    assert nothing(held(fake, pool)), held(fake, pool)
    return seen


# ── credentials, when the pool is built ────────────────────────────────────────────────

_SNIPPET = """
import skyward as sky
try:
    sky.ComputePool(provider=sky.Verda(), accelerator=sky.accelerators.H100(), nodes=4)
    print("BUILT")
except sky.ProvisionError as error:
    print("ProvisionError:", error)
"""


def test_the_public_snippet_without_credentials_stops_when_the_pool_is_built() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERDA_")}
    done = subprocess.run(
        [sys.executable, "-c", _SNIPPET], capture_output=True, text=True, timeout=60, env=env
    )
    assert "ProvisionError: no Verda credentials: set VERDA_CLIENT_ID" in done.stdout, done


def test_refused_credentials_are_a_skyward_error_when_the_pool_is_built(verda: VerdaFake) -> None:
    verda.refuse_credentials()
    with pytest.raises(ProvisionError) as caught:
        sky.ComputePool(provider=provider(verda), accelerator="H100:8", nodes=2, quiet=True)
    assert "Verda refused the credentials" in str(caught.value)
    assert "VERDA_CLIENT_ID and VERDA_CLIENT_SECRET" in str(caught.value)
    assert [r.path for r in verda.requests()] == ["/oauth2/token"]


def test_credentials_come_from_the_environment(
    verda: VerdaFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERDA_CLIENT_ID", CLIENT_ID)
    monkeypatch.setenv("VERDA_CLIENT_SECRET", CLIENT_SECRET)
    sky.ComputePool(provider=sky.Verda(endpoint_url=verda.url), quiet=True)
    (asked,) = verda.requests("POST", "/oauth2/token")
    assert asked.body == {
        "grant_type": "client_credentials",
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
    }


def test_the_token_is_cached_renewed_before_it_expires_and_after_a_401(verda: VerdaFake) -> None:
    api = Api(CLIENT_ID, CLIENT_SECRET, verda.url)
    for _ in range(3):
        api.call("GET", "/instance-types", "reading")
    assert len(verda.requests("POST", "/oauth2/token")) == 1  # cached
    verda.expire_tokens()  # refused before its time: fetched again, the call asked again
    assert api.call("GET", "/instance-types", "reading")
    assert len(verda.requests("POST", "/oauth2/token")) == 2
    assert [r.path for r in verda.requests()][-3:] == [
        "/instance-types",
        "/oauth2/token",
        "/instance-types",
    ]
    verda.token_seconds = 30.0  # inside the last minute: never used, always fetched again
    short = Api(CLIENT_ID, CLIENT_SECRET, verda.url)
    before = len(verda.requests("POST", "/oauth2/token"))
    for _ in range(2):
        short.call("GET", "/instance-types", "reading")
    assert len(verda.requests("POST", "/oauth2/token")) == before + 2
    tokens = [r.token for r in verda.requests("GET", "/instance-types")[-2:]]
    assert tokens[0] != tokens[1]


def test_credentials_revoked_after_a_token_was_given_are_said_on_the_next_call(
    verda: VerdaFake,
) -> None:
    api = provider(verda).api()
    api.call("GET", "/instance-types", "reading")
    verda.refuse_credentials()
    with pytest.raises(ProvisionError, match="Verda refused the credentials") as caught:
        api.call("GET", "/instances", "listing instances")
    assert "console.verda.com" in str(caught.value)


def test_bad_settings_are_refused_naming_the_field() -> None:
    for settings, field in [
        ({"location": "fin-01"}, "location"),
        ({"os_volume_gb": 10}, "os_volume_gb"),
        ({"endpoint_url": "api.verda.com"}, "endpoint_url"),
        ({"instance_type": "8 H100"}, "instance_type"),
    ]:
        with pytest.raises(ValidationError) as caught:
            sky.Verda(**settings)
        assert field in str(caught.value)
    assert sky.Verda(region="FIN-02").location == "FIN-02"  # the public project's spelling
    for settings in ({"connect": "private"}, {"ssh_cidr": "203.0.113.7/32"}):
        with pytest.raises(ValueError, match="no firewall"):
            sky.ComputePool(provider=sky.Verda(**settings), quiet=True)


def test_max_hourly_cost_refuses_before_anything_is_made(verda: VerdaFake) -> None:
    with pytest.raises(ProvisionError, match=r"about \$36.64/h"):
        sky.ComputePool(
            provider=provider(verda), accelerator="H100:8", nodes=2, max_hourly_cost=5, quiet=True
        )
    assert verda.requests() == []


# ── what Verda is asked for ────────────────────────────────────────────────────────────


def test_request_shapes_key_script_and_instances(verda: VerdaFake) -> None:
    seen = _stopped_at(verda, "waiting for 2", "shapes", accelerator="H100:8")
    assert {k for k, v in seen["held"].items() if v} == {
        "instances",
        "volumes",
        "ssh keys",
        "startup scripts",
    }
    (key,) = verda.requests("POST", "/sshkeys")
    assert set(key.body) == {"name", "key"} and key.body["key"].startswith("ssh-ed25519 ")
    (script,) = verda.requests("POST", "/scripts")
    assert script.body["name"] == key.body["name"]
    text = script.body["script"]
    assert text.startswith("#!/bin/sh") and WATCHDOG_PATH in text
    assert key.body["key"] in text  # the login key, for the login user
    tags = json.loads(text.rstrip("\n").rsplit("\n", 1)[-1].removeprefix("# skyward-tags: "))
    assert tags["skyward-pool"] == "shapes"
    assert "VERDA" not in text and CLIENT_SECRET not in text  # no account key on a VM
    check = verda.requests("GET", "/instance-availability/*")[0]
    assert (check.path, check.query) == (
        "/instance-availability/8H100.80S.176V",
        {"isSpot": "false", "location_code": "FIN-01"},
    )
    creates = verda.requests("POST", "/instances")
    assert sorted(c.body["hostname"] for c in creates) == [
        f"{key.body['name']}-n{rank}" for rank in (0, 1)
    ]
    body = creates[0].body
    assert body["instance_type"] == "8H100.80S.176V" and body["location_code"] == "FIN-01"
    assert body["image"] == "ubuntu-24.04-cuda-12.8-open-docker" and body["is_spot"] is False
    assert body["os_volume"] == {"name": body["hostname"], "size": 100}
    assert body["startup_script_id"] and len(body["ssh_key_ids"]) == 1
    assert json.loads(body["description"].removeprefix("Skyward pool ")) == tags
    deletes = verda.requests("PUT", "/instances")
    assert all(d.body["action"] == "delete" and d.body["delete_permanently"] for d in deletes)
    assert all(d.body["volume_ids"] for d in deletes)  # the OS volume goes too
    assert seen["recorder"].choices[0].hourly == 18.32


def test_location_instance_type_image_and_disk_are_honoured(verda: VerdaFake) -> None:
    _stopped_at(
        verda,
        "waiting for 1",
        "chosen",
        nodes=1,
        location="FIN-02",
        instance_type="8A100.80S.176V",
        image="ubuntu-22.04",
        os_volume_gb=500,
    )
    (body,) = [r.body for r in verda.requests("POST", "/instances")]
    assert (body["location_code"], body["instance_type"]) == ("FIN-02", "8A100.80S.176V")
    assert body["image"] == "ubuntu-22.04" and body["os_volume"]["size"] == 500


def test_spot_asks_is_spot_and_drops_the_volume_when_reclaimed(verda: VerdaFake) -> None:
    _stopped_at(verda, "waiting for 1", "spot", nodes=1, accelerator="H100", spot=True)
    (body,) = [r.body for r in verda.requests("POST", "/instances")]
    assert body["is_spot"] is True and body["location_code"] == "FIN-03"
    assert body["os_volume"]["on_spot_discontinue"] == "delete_permanently"
    assert verda.requests("GET", "/instance-availability")[0].query == {"isSpot": "true"}


def test_spot_if_available_falls_back_to_on_demand(verda: VerdaFake) -> None:
    verda.fill("1H100.80S.32V", "FIN-03", spot=True)
    made = request(accelerator="H100", nodes=1, deadline=Checkpoint("waiting for 1"))
    made = dataclasses.replace(made, allocation="spot-if-available")
    recorder = Recorder()
    with pytest.raises(KeyboardInterrupt):
        provider(verda).provision(made, recorder)
    markets = [
        (r.body["is_spot"], r.body["location_code"]) for r in verda.requests("POST", "/instances")
    ]
    assert markets == [(True, "FIN-03"), (False, "FIN-01")]
    assert any("trying 1H100.80S.32V on-demand in FIN-01" in s for s in recorder.statuses)


# ── capacity: refused at create, or ended no_capacity; the next place ──────────────────


def test_a_capacity_refusal_moves_to_the_next_location_and_leaves_nothing(
    verda: VerdaFake,
) -> None:
    verda.fill("8H100.80S.176V", "FIN-01")  # availability says yes; the create is refused
    seen = _stopped_at(verda, "waiting for 2", "moved", accelerator="H100:8")
    places = [r.body["location_code"] for r in verda.requests("POST", "/instances")]
    assert places.count("FIN-01") >= 1 and places[-2:] == ["FIN-02", "FIN-02"]
    assert any("in FIN-01" in s and "trying" in s for s in seen["recorder"].statuses)


def test_instances_that_end_no_capacity_are_deleted_and_the_next_place_tried(
    verda: VerdaFake,
) -> None:
    verda.fill("8H100.80S.176V", "FIN-01", how="placed")
    _stopped_at(verda, "waiting for 2", "placed", accelerator="H100:8")
    creates = verda.requests("POST", "/instances")
    assert [r.body["location_code"] for r in creates] == ["FIN-01"] * 2 + ["FIN-02"] * 2


def test_no_capacity_anywhere_names_every_place_tried(verda: VerdaFake) -> None:
    verda.fill("8H100.80S.176V", "FIN-01")
    verda.fill("8H100.80S.176V", "FIN-02", how="placed")
    with pytest.raises(CapacityError) as caught:
        provider(verda).provision(request(pool="full", accelerator="H100:8"), SilentReporter())
    message = str(caught.value)
    assert "tried 2" in message
    assert "8H100.80S.176V on-demand in FIN-01" in message
    assert "8H100.80S.176V on-demand in FIN-02" in message
    assert nothing(held(verda, "full"))


def test_a_type_available_nowhere_is_said_before_anything_is_made(verda: VerdaFake) -> None:
    verda.available[False] = {}
    with pytest.raises(CapacityError, match=r"no Verda location has 8B200\.240V available now"):
        provider(verda).provision(request(pool="none", accelerator="B200:8"), SilentReporter())
    assert verda.requests("POST") == verda.requests("POST", "/oauth2/token")


# ── instances that go wrong, and the leak matrix ───────────────────────────────────────


def test_an_instance_that_turns_error_fails_the_start_naming_it(verda: VerdaFake) -> None:
    verda.spoil("-n1")
    with pytest.raises(ProvisionError) as caught:
        provider(verda).provision(request(pool="spoiled"), SilentReporter())
    assert re.search(r"instance [0-9a-f-]{36} is error: Verda reports an error", str(caught.value))
    assert nothing(held(verda, "spoiled"))


@pytest.mark.parametrize(
    ("step", "made_by_then"),
    [
        ("registering the SSH key", set()),
        ("registering the startup script", {"ssh keys"}),
        ("launching 2", {"ssh keys", "startup scripts"}),
        ("place the instances", {"ssh keys", "startup scripts", "instances", "volumes"}),
        ("waiting for 2", {"ssh keys", "startup scripts", "instances", "volumes"}),
    ],
    ids=["before-key", "before-script", "before-create", "placing", "after-create"],
)
@pytest.mark.parametrize(
    "error", [KeyboardInterrupt(), ProvisionError("injected failure")], ids=["ctrl-c", "failure"]
)
def test_a_start_stopped_at_any_step_leaves_nothing(
    verda: VerdaFake, step: str, made_by_then: set[str], error: BaseException
) -> None:
    at_stop: dict[str, Any] = {}
    made = request(
        pool="stopped",
        deadline=Checkpoint(
            step, error=error, reached=lambda: at_stop.update(held(verda, "stopped"))
        ),
    )
    with pytest.raises(type(error)):
        provider(verda).provision(made, Recorder())
    assert {kind for kind, names in at_stop.items() if names} == made_by_then
    assert nothing(held(verda, "stopped"))


def test_what_teardown_cannot_delete_is_named_and_down_removes_it(verda: VerdaFake) -> None:
    verda.fail_requests("DELETE", "/scripts/*", 500, "server_error", "Internal error", times=None)
    made = request(pool="undeletable", deadline=Checkpoint("waiting for"))
    with pytest.raises(KeyboardInterrupt) as caught:
        provider(verda).provision(made, SilentReporter())
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "could not delete startup script" in notes and "server_error" in notes
    assert "skyward down --pool undeletable --cloud verda" in notes
    assert (
        held(verda, "undeletable")["startup scripts"]
        and not held(verda, "undeletable")["instances"]
    )
    verda.clear_faults()
    inventory = provider(verda).inventory()
    assert inventory is not None
    found = inventory.leftovers(pool="undeletable")
    assert {(x.kind, x.pool) for x in found} == {("startup script", "undeletable")}
    inventory.delete(found, SilentReporter())
    assert nothing(held(verda, "undeletable"))


def test_instances_still_deleting_after_release_timeout_are_named(verda: VerdaFake) -> None:
    made = request(
        pool="slow",
        deadline=Checkpoint("waiting for 2", reached=lambda: setattr(verda, "polls", 10**6)),
    )
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            provider(verda, release_timeout=2).provision(made, SilentReporter())
    finally:
        verda.polls = 2
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert re.search(
        r"could not delete instance [0-9a-f-]{36} \(still deleting after release_timeout \(2 s\)\)",
        notes,
    ), notes
    assert "skyward down --pool slow --cloud verda" in notes
    while held(verda, "slow")["instances"]:
        provider(verda).api().call("GET", "/instances", "reading")  # Verda gets there
    assert nothing(held(verda, "slow"))


def test_the_inventory_finds_a_pools_instances_script_and_key(verda: VerdaFake) -> None:
    seen: dict[str, Any] = {}
    inventory = provider(verda).inventory()
    assert inventory is not None

    def look() -> None:
        seen["pool"] = inventory.leftovers(pool="Left Over")
        seen["other"] = inventory.leftovers(pool="someone else")

    made = request(
        pool="Left Over", accelerator="H100", deadline=Checkpoint("waiting for", reached=look)
    )
    with pytest.raises(KeyboardInterrupt):
        provider(verda).provision(made, SilentReporter())
    kinds = sorted((x.kind, x.pool) for x in seen["pool"])
    assert kinds == [
        ("instance", "Left Over"),
        ("instance", "Left Over"),
        ("ssh key", "Left Over"),
        ("startup script", "Left Over"),
    ]
    instances = [x for x in seen["pool"] if x.kind == "instance"]
    assert all(x.hourly_cost == pytest.approx(2.29) and x.region == "FIN-01" for x in instances)
    assert all(x.created is not None and "@" in x.owner for x in instances)
    assert seen["other"] == []


def _launched(verda: VerdaFake, pool: str) -> tuple[CloudPool, list[str]]:
    """Two instances of a pool made through the contract's calls, without SSH."""
    options, made = provider(verda), request(pool=pool)
    machines = options.machines(made)
    allocation = CloudPool(options, machines, made)
    want = Want(made, "on-demand", allocation.launching, SilentReporter())
    found = machines.offers(want)
    machines.prepare(want, found.offers, allocation._keys(found.offers[0]), allocation.record)
    return allocation, allocation._launch(found.offers[0], [0, 1], allocation.launching)


def test_loss_reason_says_an_instance_was_shut_down_or_is_gone(verda: VerdaFake) -> None:
    allocation, (first, second) = _launched(verda, "lost")
    try:
        assert allocation.loss_reason(0) is None  # on its way: not a loss
        verda.power_off(first)
        assert allocation.loss_reason(0) == (
            f"instance {first} is offline: it was shut down (the idle watchdog, or a shutdown "
            f"run on it); Verda bills a shut-down instance until it is deleted"
        )
        api = provider(verda).api()
        volume = next(i["os_volume_id"] for i in verda.instances() if i["id"] == second)
        body = {"id": [second], "action": "delete", "volume_ids": [volume]}
        api.call("PUT", "/instances", "deleting", body)
        while any(i["id"] == second for i in verda.instances()):
            api.call("GET", "/instances", "reading")  # the fake moves on as it is read
        assert allocation.loss_reason(1) == (
            f"instance {second} is gone: Verda no longer lists it (deleted)"
        )
    finally:
        allocation.terminate()
    assert nothing(held(verda, "lost"))


def test_a_named_type_the_catalog_lacks_is_described_by_verda(verda: VerdaFake) -> None:
    made = request(pool="named")
    machines = provider(verda, instance_type="CPU.8V.32G").machines(made)
    found = machines.offers(Want(made, "on-demand", Deadline(30, "t"), SilentReporter()))
    first = found.offers[0]
    assert (first.machine.type, first.machine.vcpus, first.machine.ram_gb) == ("CPU.8V.32G", 8, 32)
    assert (first.hourly, first.zone) == (0.06, "FIN-01")


def test_the_image_is_one_the_type_lists(verda: VerdaFake) -> None:
    _stopped_at(verda, "waiting for 1", "cpu", nodes=1)
    (body,) = [r.body for r in verda.requests("POST", "/instances")]
    assert (body["instance_type"], body["image"]) == ("CPU.4V.16G", "ubuntu-24.04")


# ── a client ended by a signal (a job scheduler's cancel, a closed terminal) ───────────

_CLIENT = """
import skyward as sky
verda = sky.Verda(client_id={id!r}, client_secret={secret!r}, endpoint_url={url!r},
                  release_timeout=30, boot_timeout=120)
with sky.ComputePool(provider=verda, nodes=2, name={pool!r}, console="plain") as pool:
    print("READY", flush=True)
"""


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_a_client_ended_by_a_signal_while_connecting_leaves_nothing(
    verda: VerdaFake, tmp_path: Any, signal_name: str
) -> None:
    pool = f"signalled-{signal_name.lower()}"
    # Nothing listens there: SSH is refused and retried, as while a VM boots.
    verda.address_plan = lambda hostname: f"127.0.0.{30 + int(hostname[-1])}"
    script = _CLIENT.format(id=CLIENT_ID, secret=CLIENT_SECRET, url=verda.url, pool=pool)
    log = tmp_path / "client.log"
    try:
        with open(log, "wb") as out:  # signalled as from a terminal, however this run started
            client = subprocess.Popen(
                [sys.executable, "-c", script],
                stdout=out,
                stderr=out,
                env={**os.environ, "TMPDIR": str(tmp_path)},  # its key, should it be killed
                preexec_fn=as_from_a_terminal,
            )
        try:
            end = time.monotonic() + 60
            while "connecting" not in log.read_text():
                assert client.poll() is None, log.read_text()
                assert time.monotonic() < end, log.read_text()
                time.sleep(0.05)
            assert held(verda, pool)["instances"] and list(tmp_path.glob("skyward-key-*"))
            client.send_signal(getattr(signal, signal_name))
            status = client.wait(60)
        finally:
            client.kill()
            client.wait(30)
    finally:
        verda.address_plan = None
    assert status == -getattr(signal, signal_name), log.read_text()
    assert nothing(held(verda, pool)), log.read_text()
    assert not list(tmp_path.glob("skyward-key-*"))

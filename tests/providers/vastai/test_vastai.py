"""The Vast.ai provider against its REST API fake (a real HTTP server speaking Vast's JSON):
what it searches for and rents, what it says when Vast refuses, how it moves past an offer
gone, and that a start stopped anywhere leaves nothing rented. Reaching the instances over
SSH is in ``test_vastai_standins.py``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from support.clouds.aws.pools import Checkpoint, key_file_of, request
from support.clouds.vastai.fake import KEY, VastFake, ask
from support.reporter import Recorder

import skyward as sky
from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.providers.base import ProvisionRequest
from skyward.providers.cloud.capacity import CapacityError
from skyward.providers.vastai import credentials
from skyward.providers.vastai.api import Api, find_key
from skyward.providers.vastai.machines import described

pytestmark = pytest.mark.timeout(120)


def provider(fake: VastFake, **options: Any) -> sky.VastAI:
    settings: dict[str, Any] = {"api_key": KEY, "release_timeout": 30.0, **options}
    return sky.VastAI(endpoint_url=fake.url, **settings)


def stopped_at(step: str, **fields: Any) -> ProvisionRequest:
    """A request whose start is stopped (a Ctrl-C) at ``step``."""
    return dataclasses.replace(request(deadline=Checkpoint(step)), **fields)


def rents(fake: VastFake) -> list[dict[str, Any]]:
    return [r.body for r in fake.requests("PUT", "/asks/*")]


# ── before anything is rented ──────────────────────────────────────────────────────────


def test_the_public_projects_spellings_construct() -> None:
    assert sky.VastAI.ubuntu() == "nvcr.io/nvidia/cuda:12.9.1-runtime-ubuntu24.04"
    image = sky.VastAI.ubuntu(version="22.04", cuda="12.4.1")
    assert image == "nvcr.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04"
    made = sky.VastAI(
        geolocation="us", min_reliability=0.9, docker_image=image, verified_only=False
    )
    assert (made.geolocation, made.image, made.verified) == (("US",), image, False)
    assert sky.VastAI(geolocation=["DE", "nl"]).geolocation == ("DE", "NL")
    assert "api_key" not in repr(sky.VastAI(api_key="secret"))


def test_bad_settings_are_validation_errors_naming_the_field() -> None:
    for settings, field in [
        ({"geolocation": "Texas"}, "geolocation"),
        ({"min_reliability": 1.5}, "min_reliability"),
        ({"bid_multiplier": 0.5}, "bid_multiplier"),
        ({"disk_gb": 2}, "disk_gb"),
    ]:
        with pytest.raises(ValidationError, match=field):
            sky.VastAI(**settings)


def test_no_key_says_where_to_put_one_when_the_pool_is_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    with pytest.raises(ProvisionError, match=r"VAST_API_KEY.*vastai set api-key"):
        sky.ComputePool(provider=sky.VastAI(), accelerator="RTX_4090", quiet=True)
    assert credentials.check({}, tmp_path).status == "missing"
    saved = tmp_path / ".config" / "vastai" / "vast_api_key"
    saved.parent.mkdir(parents=True)
    saved.write_text("abc\n")
    assert find_key({}, tmp_path) == ("abc", str(saved))
    assert credentials.check({}, tmp_path).detail == f"in {saved}"
    assert find_key({"VAST_API_KEY": "env"}, tmp_path) == ("env", "VAST_API_KEY")


def test_a_gang_plugin_across_nodes_is_refused_and_one_node_is_not() -> None:
    vast = sky.VastAI(api_key=KEY)
    with pytest.raises(ValueError, match=r"Vast.ai.s instances are containers on separate hosts"):
        sky.ComputePool(provider=vast, nodes=2, plugins=[sky.plugins.jax()], quiet=True)
    sky.ComputePool(
        provider=vast, nodes=1, accelerator="RTX_4090:2", plugins=[sky.plugins.jax()], quiet=True
    )


def test_a_bad_key_is_said_before_anything_is_rented(vast: VastFake) -> None:
    with pytest.raises(ProvisionError, match=r"Vast.ai refused the API key .*auth_error"):
        provider(vast, api_key="wrong").provision(request(), Recorder())
    assert rents(vast) == []


# ── offers ─────────────────────────────────────────────────────────────────────────────


def test_the_search_asks_for_the_gpu_count_places_hosts_and_sizes(vast: VastFake) -> None:
    vast.reset(
        [
            ask(1, "A100 SXM4", num_gpus=2, gpu_ram=81920, geolocation="Hesse, DE"),
            ask(2, "A100 PCIE", num_gpus=2, gpu_ram=81920, geolocation="Oslo, NO"),
        ]
    )
    made = stopped_at("to run", accelerator="A100-80GB:2", vcpus=8.0, memory_gb=32.0)
    with pytest.raises(KeyboardInterrupt):
        provider(vast, geolocation="EU", min_reliability=0.97).provision(made, Recorder())
    (search,) = [r.body for r in vast.requests("POST", "/bundles/")]
    assert search["gpu_name"] == {"in": ["A100 PCIE", "A100 SXM4", "A100X"]}
    assert search["num_gpus"] == {"eq": 2}
    assert search["gpu_ram"]["gte"] == 80000 and search["gpu_ram"]["lte"] >= 81920
    assert search["reliability"] == {"gte": 0.97} and search["verified"] == {"eq": True}
    assert {"DE", "NO", "FR"} <= set(search["geolocation"]["in"])
    assert search["cpu_cores_effective"] == {"gte": 8.0} and search["cpu_ram"] == {"gte": 32000.0}
    assert search["type"] == "on-demand" and search["order"] == [["dph_total", "asc"]]
    assert search["direct_port_count"] == {"gte": 1}
    assert sorted(int(r.path.split("/")[2]) for r in vast.requests("PUT")) == [1, 2]
    assert vast.live() == []


def test_each_node_rents_the_cheapest_offers_with_the_start_command_and_no_key(
    vast: VastFake,
) -> None:
    made = stopped_at("to run", accelerator="RTX_4090")
    with pytest.raises(KeyboardInterrupt):
        provider(vast, disk_gb=40).provision(made, Recorder())
    assert [int(r.path.split("/")[2]) for r in vast.requests("PUT")] == [1, 2]
    first, second = rents(vast)
    assert first["image"] == sky.VastAI.ubuntu() and first["disk"] == 40
    assert (first["runtype"], first["onstart"], first["env"]) == ("args", "sh", {"-p 22:22": "1"})
    assert first["args"][0] == "-c" and "price" not in first
    script = first["args"][1]
    assert "ssh-ed25519 " in script and "/usr/sbin/sshd -p 22" in script
    assert "skyward-end-container" in script and "kill -TERM 1" not in script  # base64'd
    assert script.rstrip().endswith("done") and "trap 'exit 0' TERM" in script
    assert first["label"].endswith("-node-0") and second["label"].endswith("-node-1")
    assert first["label"].startswith(f"skyward-{made.pool}-")
    every = json.dumps([r.body for r in vast.log])
    assert KEY not in every  # the account's key is a header to Vast, never a machine's
    assert vast.requests(path="/ssh/*") == [] and vast.ssh_keys == []
    assert vast.live() == []


def test_the_price_is_shown_before_anything_is_rented(vast: VastFake) -> None:
    recorder = Recorder()
    seen: dict[str, Any] = {}

    def look() -> None:
        seen["rents"], seen["choices"] = len(rents(vast)), list(recorder.choices)

    made = dataclasses.replace(request(deadline=Checkpoint("renting", reached=look)))
    with pytest.raises(KeyboardInterrupt):
        provider(vast).provision(made, recorder)
    assert seen["rents"] == 0
    (choice,) = seen["choices"]
    assert choice.hourly == pytest.approx((0.31 + 0.32) / 2)
    assert choice.machine == "1x RTX 4090" and choice.market == "on-demand"


def test_spot_rents_interruptible_at_a_bid_and_spot_if_available_falls_back(
    vast: VastFake,
) -> None:
    with pytest.raises(KeyboardInterrupt):
        provider(vast, spot=True).provision(stopped_at("to run"), Recorder())
    assert [r.body["type"] for r in vast.requests("POST", "/bundles/")] == ["bid"]
    assert [body["price"] for body in rents(vast)] == [0.24, 0.24]
    vast.reset([ask(1, min_bid=None), ask(2, min_bid=None)])
    made = stopped_at("to run", allocation="spot-if-available")
    with pytest.raises(KeyboardInterrupt):
        provider(vast).provision(made, Recorder())
    assert [r.body["type"] for r in vast.requests("POST", "/bundles/")] == ["bid", "on-demand"]
    assert all("price" not in body for body in rents(vast)) and len(rents(vast)) == 2
    assert vast.live() == []


def test_an_offer_gone_when_rented_moves_to_the_next_and_the_last_error_names_them(
    vast: VastFake,
) -> None:
    gone = "error 404/3603: no_such_ask Instance type by id 1 is not available."
    vast.fail("PUT", "/asks/1/", 404, "invalid_args", gone)
    recorder = Recorder()
    with pytest.raises(KeyboardInterrupt):
        provider(vast).provision(stopped_at("to run"), recorder)
    assert [int(r.path.split("/")[2]) for r in vast.requests("PUT")] == [1, 2, 3]
    vast.reset([ask(1), ask(2), ask(3)])
    for id in (2, 3):
        vast.fail("PUT", f"/asks/{id}/", 404, "invalid_args", gone.replace("1", str(id)))
    with pytest.raises(CapacityError) as caught:
        provider(vast).provision(request(), Recorder())
    assert "gone when rented: 2, 3" in str(caught.value)
    assert "no place could take 2 machine(s)" in str(caught.value)
    assert vast.live() == []


def test_too_few_offers_and_a_price_cap_are_said_before_anything_is_rented(
    vast: VastFake,
) -> None:
    vast.no_offers = True
    with pytest.raises(ProvisionError, match=r"Vast.ai has 0 on-demand offer.*min_reliability"):
        provider(vast).provision(request(accelerator="H100"), Recorder())
    vast.no_offers = False
    capped = dataclasses.replace(request(), max_hourly_cost=0.5)
    with pytest.raises(ProvisionError, match="nothing was rented"):
        provider(vast).provision(capped, Recorder())
    assert rents(vast) == []


def test_out_of_credit_stops_at_the_first_rent_and_says_where_to_add_it(vast: VastFake) -> None:
    vast.credit = 0.0
    with pytest.raises(ProvisionError, match=r"balance is too low.*billing") as caught:
        provider(vast).provision(request(), Recorder())
    assert not isinstance(caught.value, CapacityError)
    assert len(rents(vast)) == 1 and vast.live() == []


# ── teardown on every path ─────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("step", "nth", "error"),
    [
        ("searching", 1, KeyboardInterrupt()),
        ("renting", 2, KeyboardInterrupt()),  # node 0 rented, node 1 not yet
        ("renting", 2, ProvisionError("refused")),
        ("to run", 1, KeyboardInterrupt()),
        ("to run", 3, TimeoutError("provision_timeout")),  # some of them loading
    ],
)
def test_a_start_stopped_at_any_step_leaves_nothing(
    vast: VastFake, step: str, nth: int, error: BaseException
) -> None:
    at_stop: dict[str, Any] = {}

    def look() -> None:
        at_stop["live"] = vast.live()
        at_stop["keys"] = [key_file_of(p) for p in _login_keys(vast)]

    made = request(deadline=Checkpoint(step, nth=nth, error=error, reached=look))
    with pytest.raises(type(error)):
        provider(vast).provision(made, Recorder())
    assert vast.live() == []
    assert step == "searching" or all(key is not None for key in at_stop["keys"])
    assert all(key is None or not key.exists() for key in at_stop["keys"])
    assert len(at_stop["live"]) == {"searching": 0, "renting": 1, "to run": 2}[step]


def test_a_rent_whose_answer_was_lost_is_found_by_its_label_and_destroyed(
    vast: VastFake,
) -> None:
    vast.fail("PUT", "/asks/2/", 502, "bad_gateway", "upstream timed out", after=True)
    with pytest.raises(ProvisionError, match="502"):
        provider(vast).provision(request(), Recorder())
    assert len(rents(vast)) == 2 and vast.live() == []
    assert len(vast.requests("DELETE")) == 2


def test_loss_reasons_say_outbid_exited_and_gone() -> None:
    base = {"id": 7, "is_bid": True, "status_msg": "Instance stopped: outbid by a higher bid"}
    assert described({**base, "actual_status": "stopped"}).why == (
        "interrupted by Vast.ai: outbid (an interruptible instance): Instance stopped: outbid "
        "by a higher bid"
    )
    exited = described({"id": 7, "actual_status": "exited", "status_msg": ""})
    assert exited.state == "ended" and "its main process ended" in exited.why
    assert described(None).status == "gone"
    loading = described({"id": 7, "actual_status": "loading"})
    assert loading.state == "starting" and loading.reach is None
    running = described(
        {
            "actual_status": "running",
            "public_ipaddr": "192.0.2.9\n",
            "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "40022"}]},
        }
    )
    assert running.reach is not None
    assert (running.reach.host, running.reach.port) == ("192.0.2.9", 40022)


def test_ls_finds_a_killed_clients_instances_by_label_and_down_destroys_them(
    vast: VastFake,
) -> None:
    api = Api(KEY, vast.url)
    for rank in range(2):
        api.rent(rank + 1, {"image": "x", "label": f"skyward-orphan-a1b2c3-node-{rank}"})
    api.rent(3, {"image": "x", "label": "someone else's"})
    inventory = provider(vast).inventory()
    assert inventory is not None
    found = inventory.leftovers(pool="orphan")
    assert [(x.provider, x.kind, x.pool) for x in found] == [("vastai", "instance", "orphan")] * 2
    assert inventory.leftovers(pool="other") == []
    inventory.delete(found, Recorder())
    assert [i["label"] for i in vast.live()] == ["someone else's"]


def test_the_rest_api_retries_a_busy_read_but_never_a_rent(vast: VastFake) -> None:
    vast.fail("GET", "/instances/", 429, "rate_limit_exceeded", "API requests too frequent")
    assert Api(KEY, vast.url).instances() == []
    vast.fail("PUT", "/asks/1/", 503, "unavailable", "try again")
    with pytest.raises(ProvisionError, match="503"):
        Api(KEY, vast.url).rent(1, {"image": "x"})
    assert len(vast.requests("PUT")) == 1


def _login_keys(vast: VastFake) -> list[str]:
    """The pool's public login key, read from each start command rented."""
    import re

    keys = []
    for body in rents(vast):
        found = re.search(r"printf '%s\\n' '(ssh-ed25519 [^']+)' >>", body["args"][1])
        if found:
            keys.append(found.group(1))
    return keys


def test_discard_without_waiting_returns_at_once(vast: VastFake) -> None:
    api = Api(KEY, vast.url)
    id = str(api.rent(1, {"image": "x", "label": "skyward-p-a1b2c3-node-0"}))
    from skyward.providers.vastai.machines import destroy

    assert destroy(api, [id], Deadline(0.0, "no wait")) == []
    assert vast.live() == []


_CLIENT = """
import skyward as sky
vast = sky.VastAI(api_key={key!r}, endpoint_url={url!r}, release_timeout=30, boot_timeout=120)
with sky.ComputePool(provider=vast, nodes=2, name={pool!r}, console="plain") as pool:
    print("READY", flush=True)
"""


@pytest.mark.parametrize("stage", ["renting", "connecting"])
@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_client_ended_by_a_signal_at_any_stage_leaves_nothing(
    vast: VastFake, tmp_path: Path, stage: str, signal_name: str
) -> None:
    import os
    import signal as signals
    import subprocess
    import sys
    import time

    from support.dispositions import as_from_a_terminal

    pool = f"signalled-{stage[:3]}-{signal_name.lower()}"
    if stage == "renting":
        vast.rent_delay = 3.0  # the signal comes while a rent's answer is on the wire
    # Nothing listens where port 22 is published: SSH is refused and retried, as while a
    # container boots.
    vast.placement = lambda instance: (f"127.0.0.{10 + instance['id'] % 200}", 9)
    script = _CLIENT.format(key=KEY, url=vast.url, pool=pool)
    log = tmp_path / "client.log"
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
        while not (rents(vast) if stage == "renting" else "connecting" in log.read_text()):
            assert client.poll() is None, log.read_text()
            assert time.monotonic() < end, log.read_text()
            time.sleep(0.05)
        keys = list(tmp_path.glob("skyward-key-*/id_ed25519"))
        assert len(keys) == 1, log.read_text()
        client.send_signal(getattr(signals, signal_name))
        status = client.wait(60)
    finally:
        client.kill()
        client.wait(30)
    assert status != 0, log.read_text()
    assert vast.live() == [], log.read_text()
    assert not keys[0].exists()


def test_skyward_ls_and_down_find_and_destroy_a_pools_instances(
    vast: VastFake, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    api = Api(KEY, vast.url)
    for rank in range(2):
        api.rent(rank + 1, {"image": "x", "label": f"skyward-orphan-a1b2c3-node-{rank}"})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_"))}
    env.update(VAST_API_KEY=KEY, SKYWARD_VASTAI_ENDPOINT=vast.url, HOME=str(tmp_path))
    skyward = str(Path(sys.executable).parent / "skyward")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [skyward, *args, "--cloud", "vastai"]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)

    listed = run("ls", "--pool", "orphan")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    rows = [line for line in listed.stdout.splitlines() if line.startswith("vastai ")]
    assert len(rows) == 2 and all("orphan" in row and "instance" in row for row in rows), rows
    removed = run("down", "--pool", "orphan", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert vast.live() == []
    assert "Nothing left" in run("ls").stdout

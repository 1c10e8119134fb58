"""SIGTERM and SIGHUP end a client the way Ctrl-C does: its pool's machines, group, key pair
and local key directory go, at every stage of a start and while a job runs; then the client
ends as killed by the signal (a job scheduler's cancel, a closed terminal, ``kill PID``).

Each test runs a real client process against moto (through the tests' EC2 proxy where a
stage has to be held still) and stand-in VMs where the machines must answer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.pools import held, nothing, pool_key_of
from support.clouds.aws.pools import standin_provider as aws
from support.clouds.aws.proxy import Ec2Proxy
from support.clouds.aws.standins import StandInCloud
from support.dispositions import as_from_a_terminal, handled_by_default
from support.sshhosts import Hosts, PackageIndex

import skyward as sky
from skyward.pool import signals

_CLIENT = """
import time
import skyward as sky
aws = sky.AWS(**{settings!r})
with sky.ComputePool(provider=aws, nodes=2, image=sky.Image(index_url={index!r}),
                     name={pool!r}, console="plain") as pool:
    print("READY", flush=True)
    pool.broadcast(time.sleep, 3600)
"""

SIGNALS = [signal.SIGTERM, signal.SIGHUP]


def _client(settings: dict[str, Any], index: str, pool: str, log: Path) -> Any:
    """The client, signalled as a program run from a terminal is, whatever this run's own
    dispositions (support/dispositions.py); its pool key goes beside ``log``, not into the
    machine's temporary directory, should it be killed before it can delete it."""
    script = _CLIENT.format(settings=settings, index=index, pool=pool)
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TMPDIR": str(log.parent)},
            preexec_fn=as_from_a_terminal,
        )


def _wait_for(condition: Any, timeout: float, what: str, log: Path) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"{what}: not within {timeout:g} s\n{log.read_text()}"
        time.sleep(0.1)


def _ended_by(client: Any, signum: int, log: Path) -> None:
    try:
        status = client.wait(150)
    except subprocess.TimeoutExpired as exc:
        client.kill()
        client.wait(30)
        message = f"the client did not end after the signal:\n{log.read_text()}"
        raise AssertionError(message) from exc
    assert status == -signum, f"exit status {status}\n{log.read_text()}"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_signal_while_the_group_is_being_created_leaves_nothing(
    moto: MotoServer, signum: int, tmp_path: Path
) -> None:
    log = tmp_path / "client.log"
    with Ec2Proxy(moto.url) as proxy:
        # The group is made in EC2, its answer held back: the client is signalled mid-call.
        proxy.hold("CreateSecurityGroup")
        settings = {
            "endpoint_url": proxy.url,
            "region": moto.region,
            "ami_parameter": "/skyward-tests/ubuntu/ami-id",
            "ssh_cidr": "10.123.0.0/16",
            "release_timeout": 30.0,
        }
        client = _client(settings, "http://127.0.0.1:9/simple/", "sig-group", log)
        try:
            _wait_for(proxy.reached.is_set, 120, "the group's create call", log)
            key_file = pool_key_of(moto, "sig-group", tmp_path)
            assert key_file is not None and len(held(moto, "sig-group")["key pairs"]) == 1
            client.send_signal(signum)
            _ended_by(client, signum, log)
        finally:
            proxy.release()
            if client.poll() is None:
                client.kill()
    assert nothing(held(moto, "sig-group")), log.read_text()
    assert not key_file.parent.exists()
    assert signal.Signals(signum).name in log.read_text()  # Terminated, shown on its way out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_signal_while_the_machines_boot_leaves_nothing(
    moto: MotoServer, ssh_hosts: Hosts, signum: int, tmp_path: Path
) -> None:
    log = tmp_path / "client.log"
    with StandInCloud(moto, ssh_hosts, boot=False) as cloud:
        settings = aws(cloud).model_dump(exclude_defaults=True)
        client = _client(settings, "http://127.0.0.1:9/simple/", "sig-boot", log)
        try:
            _wait_for(lambda: "connecting" in log.read_text(), 120, "connecting", log)
            assert len(held(moto, "sig-boot")["instances"]) == 2
            key_file = pool_key_of(moto, "sig-boot", tmp_path)
            assert key_file is not None
            client.send_signal(signum)
            _ended_by(client, signum, log)
        finally:
            if client.poll() is None:
                client.kill()
        assert nothing(held(moto, "sig-boot")), log.read_text()
        assert not key_file.parent.exists()


@pytest.mark.timeout(400)
@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_signal_while_a_job_runs_closes_the_pool_and_leaves_nothing(
    standin_cloud: StandInCloud, package_index: PackageIndex, signum: int, tmp_path: Path
) -> None:
    log = tmp_path / "client.log"
    settings = aws(standin_cloud).model_dump(exclude_defaults=True)
    client = _client(settings, package_index.url, "sig-job", log)
    try:
        _wait_for(lambda: "READY" in log.read_text(), 300, "the pool ready", log)
        key_file = pool_key_of(standin_cloud.moto, "sig-job", tmp_path)
        assert key_file is not None
        time.sleep(1)  # the broadcast is under way
        client.send_signal(signum)
        _ended_by(client, signum, log)
    finally:
        if client.poll() is None:
            client.kill()
    assert nothing(held(standin_cloud.moto, "sig-job")), log.read_text()
    assert not key_file.parent.exists()
    standin_cloud.wait_for(
        lambda: all(s.ended for s in standin_cloud.standins.values()),
        30,
        "stand-ins stopped with their instances",
    )


# ── the handlers themselves, in this process ───────────────────────────────────────────


def test_handlers_are_installed_while_a_pool_is_open_and_restored_after() -> None:
    with handled_by_default(*signals.SIGNALS):  # as from a terminal, not under nohup
        before = {s: signal.getsignal(s) for s in signals.SIGNALS}
        with sky.ComputePool(quiet=True):
            assert all(signal.getsignal(s) is signals._handle for s in signals.SIGNALS)
        assert {s: signal.getsignal(s) for s in signals.SIGNALS} == before


def test_an_ignored_signal_stays_ignored_and_a_users_handler_is_called() -> None:
    called: list[int] = []

    def mine(signum: int, frame: Any) -> None:
        called.append(signum)

    previous_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    previous_term = signal.signal(signal.SIGTERM, mine)
    try:
        with sky.ComputePool(quiet=True) as pool:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)  # the user's handler decides: it returns
            assert pool.run(sum, [1, 2]) == 3
        assert called == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGHUP, previous_hup)
        signal.signal(signal.SIGTERM, previous_term)


def test_sigterm_in_a_local_pool_raises_terminated_and_closes_it() -> None:
    with handled_by_default(signal.SIGTERM), pytest.raises(sky.Terminated) as caught:
        with sky.ComputePool(quiet=True) as pool:
            os.kill(os.getpid(), signal.SIGTERM)
            pool.run(time.sleep, 30)
    assert caught.value.signal == signal.SIGTERM
    assert isinstance(caught.value, KeyboardInterrupt)
    assert repr(pool).endswith("closed>")

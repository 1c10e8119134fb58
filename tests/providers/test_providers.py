"""The provider contract, for every provider in the registry, and what the pool promises
around ``provision``: whatever a provider made is terminated on every path, the two start
bounds mean what the docs say, and a missing SDK is an install hint before anything starts.

The registry holds the providers these tests can build here: ``local``, ``ssh`` (this run's
SSH test hosts), ``hosts`` (a provider made in ``support/providers.py`` that "creates"
machines by handing out those hosts through the shared SSH-host layer, as a cloud does) and
``aws`` (the moto server, with stand-in VMs for its instances:
``support/clouds/aws/standins.py``) and
``azure`` (the fake ARM server, with stand-ins for its VMs: ``support/clouds/azure/standins.py``),
``gcp`` (the Compute Engine fake, with stand-ins booting from its instances' metadata:
``support/clouds/gcp/standins.py``) and ``slurm`` (the Slurm testbed, ``support/slurm.py``:
a real slurmctld and slurmds in network namespaces, reached through its login host over SSH,
as ``providers/slurm/test_slurm.py`` reaches it).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.clouds.aws.pools import standin_provider
from support.clouds.azure.pools import standin_provider as azure_standin_provider
from support.clouds.gcp.standins import standin_provider as gcp_standin_provider
from support.clouds.vastai.standins import provider as vast_standin_provider
from support.pools import ssh_provider, start_in_thread
from support.processes import worker_processes
from support.providers import Preemptible, Slow, TestHosts
from support.reporter import Recorder
from support.slurm import SlurmCluster
from support.sshhosts import Hosts, PackageIndex

import skyward as sky
from skyward.pool.spec import PoolSpec
from skyward.providers.base import TAG_CREATED, TAG_OWNER, TAG_POOL, Allocation

Build = Callable[[], Any]


def _registry(request: pytest.FixtureRequest, kind: str) -> tuple[Any, sky.Image]:
    if kind == "local":
        return sky.Local(), sky.Image()
    if kind == "slurm":
        cluster: SlurmCluster = request.getfixturevalue("slurm_cluster")
        served: PackageIndex = request.getfixturevalue("slurm_index")
        login = cluster.login
        made = sky.Slurm(login=login.target, key=login.key, known_hosts=login.known_hosts)
        return made, sky.Image(index_url=served.url)
    hosts: Hosts = request.getfixturevalue("ssh_hosts")
    index: PackageIndex = request.getfixturevalue("package_index")
    image = sky.Image(index_url=index.url)
    if kind == "ssh":
        return ssh_provider(hosts), image
    if kind == "aws":
        return standin_provider(request.getfixturevalue("standin_cloud")), image
    if kind == "azure":
        return azure_standin_provider(request.getfixturevalue("azure_standins")), image
    if kind == "gcp":
        return gcp_standin_provider(request.getfixturevalue("gcp_standins")), image
    if kind == "vastai":
        return vast_standin_provider(request.getfixturevalue("vast_standins").fake), image
    return TestHosts(hosts), image


@pytest.fixture(params=["local", "ssh", "hosts", "aws", "azure", "gcp", "vastai", "slurm"])
def provider(request: pytest.FixtureRequest) -> tuple[Any, sky.Image]:
    return _registry(request, request.param)


def _request(provider: Any, image: sky.Image, nodes: int = 2) -> Any:
    return PoolSpec(provider=provider, nodes=nodes, image=image, quiet=True).request(image)


@sky.compute
def whoami() -> tuple[int, str]:
    info = sky.instance_info()
    return info.node, info.provider


# ── the contract, for every provider ────────────────────────────────────────────────────


def test_provision_gives_the_nodes_asked_for_and_terminate_is_idempotent(
    provider: tuple[Any, sky.Image],
) -> None:
    made, image = provider
    recorder = Recorder()
    allocation = made.provision(_request(made, image), recorder)
    assert isinstance(allocation, Allocation)
    assert len(allocation.nodes) == 2
    allocation.terminate()
    allocation.terminate()  # a second time is harmless
    assert allocation.terminated
    with pytest.raises(sky.ProvisionError):
        allocation.nodes[0].spawn_worker(0, {})  # a closed node starts nothing


def test_a_pool_on_every_provider_runs_calls_and_reports_each_phase(
    provider: tuple[Any, sky.Image],
) -> None:
    made, image = provider
    with sky.ComputePool(provider=made, nodes=2, image=image, quiet=True) as pool:
        assert sorted(whoami() @ pool) == [(0, made.kind), (1, made.kind)]
    assert not worker_processes()


def test_remote_providers_report_connecting_and_bootstrapping_per_node(
    request: pytest.FixtureRequest,
) -> None:
    for kind in ("ssh", "hosts", "aws", "azure", "gcp", "vastai", "slurm"):
        made, image = _registry(request, kind)
        recorder = Recorder()
        made.provision(_request(made, image), recorder).terminate()
        for node in (0, 1):
            phases = recorder.phases_of(node)
            assert "connecting" in phases and "bootstrapping" in phases, (kind, phases)


def test_every_request_carries_the_identity_tags(request: pytest.FixtureRequest) -> None:
    made, image = _registry(request, "hosts")
    assert isinstance(made, TestHosts)
    with sky.ComputePool(provider=made, nodes=1, image=image, name="tagged", quiet=True):
        pass
    (tags,) = made.made
    assert tags[TAG_POOL] == "tagged"
    assert "@" in tags[TAG_OWNER]
    assert tags[TAG_CREATED].endswith("Z")


def test_check_refuses_before_anything_is_touched(ssh_hosts: Hosts) -> None:
    # More nodes than hosts: refused when the pool is built, with no connection made
    # (the hosts' sshd would log one).
    before = [h.processes() for h in ssh_hosts.hosts]
    with pytest.raises(ValueError, match="asks for 9 nodes but SSH has"):
        sky.ComputePool(provider=ssh_provider(ssh_hosts), nodes=9, quiet=True)
    with pytest.raises(ValueError, match="only 4 test hosts"):
        sky.ComputePool(provider=TestHosts(ssh_hosts), nodes=9, quiet=True)
    # Nothing new on any host (a process an earlier test left exiting may be gone by now).
    new = [set(h.processes()) - set(was) for h, was in zip(ssh_hosts.hosts, before, strict=True)]
    assert new == [set()] * len(before)


@pytest.mark.parametrize("kind", ["ssh", "hosts"])
def test_all_or_nothing_when_one_machine_fails(
    request: pytest.FixtureRequest, ssh_hosts: Hosts, kind: str
) -> None:
    made, image = _registry(request, kind)
    broken = ssh_hosts.hosts[1]
    broken.link_down()
    try:
        fast = {"connect_timeout": 1.0} if kind == "ssh" else {}
        if kind == "ssh":
            made = ssh_provider(ssh_hosts, **fast)
        else:
            made = TestHosts(ssh_hosts, boot_timeout=1.0)
        started = time.monotonic()
        with pytest.raises(sky.ProvisionError, match=broken.address):
            with sky.ComputePool(provider=made, nodes=2, image=image, quiet=True):
                pass
        assert time.monotonic() - started < 60
    finally:
        broken.link_up()
    assert not worker_processes()


def test_a_machine_presenting_another_host_key_is_refused(ssh_hosts: Hosts) -> None:
    other = ssh_hosts.hosts[2].public_host_key()

    class Impostor(TestHosts):
        def provision(self, request: Any, reporter: Any) -> Allocation:
            from skyward.providers.ssh.connection import Target
            from skyward.providers.ssh.hosts import Access, HostTarget, open_hosts

            target = HostTarget(
                Target(self.hosts.hosts[0].address, 22, "skytest"),
                host_key=f"ssh-ed25519 {other}",
            )
            access = Access(key_file=self.hosts.client_key, boot_timeout=2.0)
            return Allocation(open_hosts([target], access, request, reporter))

    with pytest.raises(sky.HostKeyError, match="not the key the provider gave"):
        with sky.ComputePool(provider=Impostor(ssh_hosts), nodes=1, quiet=True):
            pass


# ── bug 1: a pool closed while provision runs terminates what provision returns ──────────


@pytest.mark.parametrize("honour_cancel", [False, True])
def test_closing_while_the_provider_provisions_terminates_what_it_returns(
    honour_cancel: bool,
) -> None:
    slow = Slow(sky.Local(), delay=1.5, honour_cancel=honour_cancel)
    pool = sky.ComputePool(provider=slow, nodes=2, quiet=True)
    starter, errors = start_in_thread(pool)
    assert slow.started.wait(10)
    pool.close()
    # close() returns only once nothing the provider made is left.
    assert all(a.terminated for a in slow.returned)
    starter.join(30)
    assert len(errors) == 1 and isinstance(errors[0], sky.PoolClosed)
    if honour_cancel:  # the provider noticed and stopped: it made nothing
        assert slow.returned == []
        assert isinstance(errors[0].__cause__, sky.ProvisionError)
        assert "closed" in str(errors[0].__cause__)
    else:  # it made its nodes anyway, and they were terminated
        assert len(slow.returned) == 1 and slow.returned[0].terminated
    assert not worker_processes()


def test_an_unexpected_provider_error_is_a_provision_error_with_its_cause() -> None:
    slow = Slow(sky.Local(), delay=0, fail=lambda: KeyError("region"))
    with pytest.raises(sky.ProvisionError, match="provider slow failed: KeyError") as caught:
        with sky.ComputePool(provider=slow, quiet=True):
            pass
    assert isinstance(caught.value.__cause__, KeyError)


# ── bug 2: provision_timeout bounds the machines, start_timeout the workers ─────────────


def test_start_timeout_does_not_count_provisioning() -> None:
    # Provisioning alone outlasts start_timeout, so a start that counted it would fail.
    # start_timeout itself leaves room for a worker to start on a busy machine (a cold one
    # took 5.8 s beside two busy processes; 1.5 s failed there).
    slow = Slow(sky.Local(), delay=11.0)
    with sky.ComputePool(provider=slow, start_timeout=10.0, quiet=True) as pool:
        assert whoami() >> pool == (0, "slow")


def test_provision_timeout_bounds_the_provider_and_says_so() -> None:
    slow = Slow(sky.Local(), delay=30.0, honour_cancel=True)
    started = time.monotonic()
    with pytest.raises(sky.ProvisionError, match=r"provision_timeout \(1 s\)"):
        with sky.ComputePool(provider=slow, provision_timeout=1, quiet=True):
            pass
    assert time.monotonic() - started < 20


class _Mute:
    """A node whose worker never says hello: a Python that only sleeps."""

    address = "127.0.0.1"
    accelerators = 0
    shares_files = True

    def __init__(self) -> None:
        self._processes: list[subprocess.Popen[bytes]] = []

    def spawn_worker(self, rank: int, env: Any) -> Any:
        from skyward.providers.local import PipeTransport

        process = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._processes.append(process)
        return PipeTransport(process)

    def close(self) -> None:
        for process in self._processes:
            process.kill()
            process.wait()


class _MuteProvider:
    kind = "mute"

    def check(self, request: Any) -> None:
        pass

    def provision(self, request: Any, reporter: Any) -> Allocation:
        return Allocation([_Mute() for _ in range(request.nodes)])

    def inventory(self) -> None:
        return None


def test_start_timeout_bounds_the_workers_and_says_so() -> None:
    with pytest.raises(TimeoutError, match=r"did not say hello within start_timeout \(1.5 s\)"):
        with sky.ComputePool(provider=_MuteProvider(), start_timeout=1.5, quiet=True):
            pass


# ── bug 3: a missing optional dependency names the extra, before anything starts ───────


def test_a_missing_sdk_is_an_install_hint_when_the_pool_is_built() -> None:
    # A fresh interpreter in which paramiko cannot be imported, as on a machine without it.
    code = textwrap.dedent(
        """
        import sys
        class Hide:
            def find_spec(self, name, path=None, target=None):
                if name == "paramiko" or name.startswith("paramiko."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, Hide())
        import skyward as sky
        try:
            sky.ComputePool(provider=sky.SSH(hosts=["h1"]), quiet=True)
        except sky.MissingDependency as exc:
            print("refused:", exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "refused: sky.SSH needs the Python package 'paramiko'" in out.stdout
    assert "pip install 'skyward[ssh]'" in out.stdout


def test_require_names_the_extra_for_every_optional_sdk() -> None:
    from skyward.client.extras import EXTRAS, require

    assert {EXTRAS[m] for m in ("paramiko", "boto3", "google.cloud.compute_v1", "jax")} == {
        "ssh",
        "aws",
        "gcp",
        "jax",
    }
    with pytest.raises(sky.MissingDependency, match=r"pip install 'skyward\[nope\]'"):
        require("nope", feature="a test")


# ── the shared SSH-host layer, as a cloud provider uses it ──────────────────────────────


def test_a_machine_that_is_still_booting_is_waited_for(
    ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    booting = ssh_hosts.hosts[0]
    booting.link_down()  # unreachable, as a VM is before its network is up
    threading.Timer(2.0, booting.link_up).start()
    made = TestHosts(ssh_hosts, boot_timeout=30.0)
    try:
        with sky.ComputePool(
            provider=made, image=sky.Image(index_url=package_index.url), quiet=True
        ) as pool:
            assert whoami() >> pool == (0, "test-hosts")
    finally:
        booting.link_up()


def _jax_toy() -> tuple[float, int]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2, 2), ("i", "j"))
    array = jax.device_put(np.arange(32).reshape((4, 8)), NamedSharding(mesh, P("i", "j")))
    return float(jnp.sum(jnp.sin(array))), jax.device_count()


@pytest.mark.timeout(300)
def test_jax_toy_runs_across_machines_a_provider_hands_out_through_the_shared_layer(
    ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    with sky.ComputePool(
        provider=TestHosts(ssh_hosts),
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        plugins=[sky.plugins.jax(cpu_devices=2)],
        quiet=True,
    ) as pool:
        results = pool.broadcast(_jax_toy)
    assert results == [(-0.12398731708526611, 4), (-0.12398731708526611, 4)]


# ── a lost machine is replaced when the provider can ────────────────────────────────────


def _exit_on(rank: int) -> int:
    import os

    if sky.instance_info().node == rank:
        os._exit(3)
    return os.getpid()


def _pid() -> int:
    import os

    return os.getpid()


def test_a_lost_machine_is_replaced_and_the_pool_goes_on() -> None:
    provider = Preemptible()
    with sky.ComputePool(provider=provider, nodes=2, quiet=True) as pool:
        before = pool.broadcast(_pid)
        provider.lose(1)  # its machine is gone: no new worker can start there
        with pytest.raises(sky.WorkerLost):
            pool.broadcast(_exit_on, 1)
        deadline = time.monotonic() + 30
        while pool.statistics().ready_nodes < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        after = pool.broadcast(_pid)
    assert provider.replaced == [1]
    assert after[0] == before[0] and after[1] != before[1]
    assert provider.allocations[0].terminated
    assert not worker_processes()


# ── a Ctrl-C while a cloud deletes things does not stop it half-way ─────────────────────


class _SlowRelease(Allocation):
    def __init__(self, nodes: list[Any]) -> None:
        super().__init__(nodes)
        self.releasing = threading.Event()
        self.released = False

    def release(self) -> None:
        self.releasing.set()
        time.sleep(1.5)
        self.released = True


class _SlowReleaseProvider:
    kind = "slow-release"

    def __init__(self) -> None:
        self.allocation: _SlowRelease | None = None

    def check(self, request: Any) -> None:
        pass

    def provision(self, request: Any, reporter: Any) -> Allocation:
        nodes = sky.Local().provision(request, reporter).nodes
        self.allocation = _SlowRelease(nodes)
        return self.allocation

    def inventory(self) -> None:
        return None


def _closing_with_ctrl_c(times: int) -> tuple[sky.ComputePool, Any]:
    """A started pool whose provider's deletion is slow, and a thread that presses Ctrl-C
    ``times`` times, 0.3 s apart, once the close is waiting for that deletion."""
    import signal

    provider = _SlowReleaseProvider()
    pool = sky.ComputePool(provider=provider, quiet=True).start()
    assert provider.allocation is not None
    allocation = provider.allocation

    def interrupt() -> None:
        allocation.releasing.wait(30)
        for _ in range(times):
            time.sleep(0.3)  # while the close waits for the deletion
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    return pool, allocation


def test_one_ctrl_c_during_teardown_does_not_stop_the_deletion() -> None:
    pool, allocation = _closing_with_ctrl_c(1)
    # The Ctrl-C lands while release() runs: close goes on to the end, then raises it.
    with pytest.raises(KeyboardInterrupt):
        pool.close()
    assert allocation.released
    assert pool.statistics().state == "closed"


def test_a_second_ctrl_c_during_teardown_leaves_at_once_and_the_deletion_goes_on() -> None:
    # The way out a user is offered ("Ctrl-C again to leave now"): the close's own hold
    # must not swallow it.
    pool, allocation = _closing_with_ctrl_c(2)
    with pytest.raises(KeyboardInterrupt):
        pool.close()
    assert not allocation.released  # left before the 1.5 s deletion ended
    deadline = time.monotonic() + 10
    while not allocation.released and time.monotonic() < deadline:
        time.sleep(0.05)
    assert allocation.released  # and it went on without us

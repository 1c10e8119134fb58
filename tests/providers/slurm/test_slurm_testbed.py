"""The Slurm testbed (``support.slurm``) is a working cluster: a login host that answers over
SSH, jobs across nodes, batch jobs and cancelling, fake GPUs, a shared home, no DNS, and a
close that leaves nothing behind. One cluster serves the whole module; the last test closes
it. The latencies that ``sky.Slurm`` will live with are measured and printed here."""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import psutil
import pytest
from support.slurm import CPU_PARTITION, GPU_PARTITION, SlurmCluster


@pytest.fixture
def login_ssh(slurm_cluster: SlurmCluster) -> Iterator[paramiko.SSHClient]:
    login = slurm_cluster.login
    sock = socket.create_connection((login.address, login.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # ~3x faster, see TESTBED.md
    client = paramiko.SSHClient()
    client.load_host_keys(str(login.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            login.address,
            port=login.port,
            username=login.user,
            key_filename=str(login.key),
            sock=sock,
            look_for_keys=False,
            allow_agent=False,
            timeout=10,
        )
        yield client
    finally:
        client.close()


def _exec(client: paramiko.SSHClient, command: str) -> tuple[int, str, str]:
    _, stdout, stderr = client.exec_command(command, timeout=30)
    status = stdout.channel.recv_exit_status()
    return status, stdout.read().decode(), stderr.read().decode()


def test_login_host_answers_sinfo_over_ssh(
    slurm_cluster: SlurmCluster, login_ssh: paramiko.SSHClient
) -> None:
    status, out, err = _exec(login_ssh, "sinfo -h -o '%P %a %D %t'; hostname; echo $SLURM_CONF")
    assert status == 0, err
    assert out.splitlines() == [
        f"{CPU_PARTITION}* up 2 idle",
        f"{GPU_PARTITION} up 2 idle",
        "login",
        str(slurm_cluster.conf),
    ]


def test_openssh_client_runs_slurm_commands_on_the_login_host(
    slurm_cluster: SlurmCluster,
) -> None:
    done = subprocess.run(
        slurm_cluster.ssh_argv("squeue", "-h", "-u", "skytest"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""


def test_srun_on_two_nodes_prints_both_node_names(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.run("srun", "-N2", "hostname").stdout
    assert sorted(out.split()) == slurm_cluster.node_names == ["node0", "node1"]


def test_sbatch_sleep_job_runs_and_scancel_removes_it(slurm_cluster: SlurmCluster) -> None:
    job = slurm_cluster.run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 60")
    job_id = job.stdout.strip()
    assert slurm_cluster.wait_job_state(job_id, {"RUNNING"}, timeout=15) == "RUNNING"
    slurm_cluster.run("scancel", job_id)
    assert slurm_cluster.wait_job_state(job_id, {None}, timeout=15) is None
    assert job_id not in slurm_cluster.run("squeue", "-h", "-o", "%i").stdout.split()


def test_gpu_job_sees_cuda_visible_devices(slurm_cluster: SlurmCluster) -> None:
    one = slurm_cluster.run(
        "srun", "-p", GPU_PARTITION, "--gres=gpu:a100:1", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"
    )
    assert one.stdout.strip() == "0"
    both = slurm_cluster.run(
        "srun", "-p", GPU_PARTITION, "-N2", "--gres=gpu:a100:2", "sh", "-c",
        'echo "$(hostname) $CUDA_VISIBLE_DEVICES"',
    )  # fmt: skip
    assert sorted(both.stdout.splitlines()) == ["node0 0,1", "node1 0,1"]


def test_jobs_without_gres_see_no_gpus(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.run("srun", "sh", "-c", 'echo "[${CUDA_VISIBLE_DEVICES-unset}]"').stdout
    assert out.strip() == "[unset]"


def test_home_is_shared_by_every_host(slurm_cluster: SlurmCluster) -> None:
    note = slurm_cluster.home / "from-the-test"
    note.write_text("hello\n")
    script = "cat ~/from-the-test && hostname > ~/from-$(hostname) && pwd"
    out = slurm_cluster.run("srun", "-w", "node1", "sh", "-c", script).stdout
    assert out.splitlines() == ["hello", "/home/skytest"]
    assert (slurm_cluster.home / "from-node1").read_text() == "node1\n"


def test_hosts_resolve_each_other_from_their_own_etc_hosts(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.run("getent", "hosts", "slurmctl", "login", "node1", host="node0")
    by_name = {line.split()[1]: line.split()[0] for line in out.stdout.splitlines()}
    addresses = {h.name: h.address for h in slurm_cluster.hosts}
    assert by_name == {n: addresses[n] for n in ("slurmctl", "login", "node1")}
    resolv = slurm_cluster.run("cat", "/etc/resolv.conf", host="node0").stdout
    assert resolv == "nameserver 127.0.0.1\n"


# Answers nothing; reports every DNS query that reaches this host's loopback resolver.
_DNS_TRAP = """
import select, socket
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", 53))
tcp = socket.socket()
tcp.bind(("127.0.0.1", 53))
tcp.listen()
print("ready", flush=True)
while True:
    for s in select.select([udp, tcp], [], [])[0]:
        if s is udp:
            print("udp", udp.recvfrom(512)[0], flush=True)
        else:
            print("tcp", flush=True)
            s.accept()[0].close()
"""


def test_slurm_makes_no_dns_queries(slurm_cluster: SlurmCluster) -> None:
    traps = {}
    try:
        for host in slurm_cluster.hosts:
            traps[host.name] = subprocess.Popen(
                slurm_cluster.command_on(host.name, [sys.executable, "-c", _DNS_TRAP], user="root"),
                stdout=subprocess.PIPE,
                text=True,
            )
            assert traps[host.name].stdout.readline() == "ready\n"  # type: ignore[union-attr]
        slurm_cluster.run("srun", "-N2", "hostname")
        job = slurm_cluster.run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "hostname")
        slurm_cluster.wait_job_state(job.stdout.strip(), {None}, timeout=15)
        slurm_cluster.run("salloc", "--no-shell", "-J", "dns")
        slurm_cluster.run("scancel", "-n", "dns")
        slurm_cluster.run("sinfo")
        slurm_cluster.run("scontrol", "show", "nodes")
    finally:
        for trap in traps.values():
            trap.kill()
    queries = {name: trap.communicate(timeout=10)[0] for name, trap in traps.items()}
    assert queries == {h.name: "" for h in slurm_cluster.hosts}


def test_a_second_cluster_takes_another_subnet_and_leaves_the_first_alone(
    slurm_cluster: SlurmCluster,
) -> None:
    with SlurmCluster(1, gpus_per_node=0) as second:
        assert second.subnet != slurm_cluster.subnet
        assert second.bridge != slurm_cluster.bridge
        assert second.run("srun", "hostname").stdout.strip() == "node0"
    assert not second.leftovers()
    assert "idle" in slurm_cluster.run("sinfo", "-h", "-o", "%t").stdout


def test_latencies(slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]) -> None:
    def timed(*command: str) -> float:
        start = time.monotonic()
        slurm_cluster.run(*command)
        return time.monotonic() - start

    srun = statistics.median(timed("srun", "-N2", "true") for _ in range(5))
    salloc = []
    for _ in range(5):
        salloc.append(timed("salloc", "--no-shell", "-N1", "-J", "latency"))
        slurm_cluster.run("scancel", "-n", "latency")
    start = time.monotonic()
    job_id = slurm_cluster.run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 60")
    slurm_cluster.wait_job_state(job_id.stdout.strip(), {"RUNNING"}, timeout=15)
    sbatch = time.monotonic() - start
    slurm_cluster.run("scancel", job_id.stdout.strip())
    with capsys.disabled():
        print(
            f"\nSlurm testbed: up in {slurm_cluster.timings['start_s']:.2f} s "
            f"(install {slurm_cluster.timings['install_s']:.1f} s), srun -N2 {srun * 1000:.0f} ms, "
            f"salloc --no-shell {statistics.median(salloc) * 1000:.0f} ms, "
            f"sbatch to RUNNING {sbatch:.2f} s"
        )
    assert slurm_cluster.timings["start_s"] < 30
    assert srun < 2.0
    assert statistics.median(salloc) < 2.0
    assert sbatch < 10.0


def test_close_leaves_no_slurm_process_or_namespace(slurm_cluster: SlurmCluster) -> None:
    """Runs last: it closes the module's cluster (the fixture's own close is then a no-op)."""
    job = slurm_cluster.run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 60")
    slurm_cluster.wait_job_state(job.stdout.strip(), {"RUNNING"}, timeout=15)
    root = str(slurm_cluster.root)
    on_hosts = {pid for h in slurm_cluster.hosts for pid in slurm_cluster.processes(h.name)}
    assert len(on_hosts) > len(slurm_cluster.hosts) * 2  # keepers, daemons, the job

    slurm_cluster.close()

    assert slurm_cluster.leftovers() == []
    alive = [p for p in on_hosts if psutil.pid_exists(p) and _not_zombie(p)]
    assert alive == []
    ours = [p.info for p in psutil.process_iter(["pid", "cmdline"]) if root in _cmdline(p)]
    assert ours == []
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(h.netns in namespaces for h in slurm_cluster.hosts)
    assert not Path(f"/sys/class/net/{slurm_cluster.bridge}").exists()


def _not_zombie(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""

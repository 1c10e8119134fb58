"""What the clouds share: the user data (checked against cloud-init's own schema), the host
key, the idle watchdog (run for real, in a sandbox that cannot stop this machine), the
client's address, and "create, then open, or destroy"."""

from __future__ import annotations

import http.server
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from support import cloudinit
from support.sandbox import Sandbox

import skyward as sky
from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.providers.base import Allocation, ProvisionRequest, Resource
from skyward.providers.cloud import boot, options
from skyward.providers.cloud import start as cloud_start

_CLIENT_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAbc me@x"


@pytest.fixture(scope="module")
def user_data() -> tuple[str, boot.HostKey]:
    key = boot.HostKey.generate()
    text = boot.user_data(host_key=key, authorized_key=_CLIENT_KEY, idle_timeout=90)
    return text, key


def test_user_data_is_cloud_config_that_cloud_inits_schema_accepts(
    user_data: tuple[str, boot.HostKey],
) -> None:
    text, _ = user_data
    assert text.startswith("#cloud-config\n")
    document = yaml.safe_load(text)
    schema = cloudinit.schema()
    errors = [e.message for e in jsonschema.Draft4Validator(schema).iter_errors(document)]
    assert errors == []
    assert set(document) <= cloudinit.known_keys(schema)


def test_user_data_gives_the_vm_our_host_key_and_only_it(
    user_data: tuple[str, boot.HostKey],
) -> None:
    text, key = user_data
    document = yaml.safe_load(text)
    assert document["ssh_deletekeys"] is True
    assert document["ssh_keys"] == {"ed25519_private": key.private, "ed25519_public": key.public}
    assert document["ssh_authorized_keys"] == [_CLIENT_KEY]


def test_the_host_key_pair_matches() -> None:
    key = boot.HostKey.generate()
    private = serialization.load_ssh_private_key(key.private.encode(), password=None)
    derived = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    assert derived.decode() == key.public
    assert key.public.startswith("ssh-ed25519 ")
    assert boot.HostKey.generate().public != key.public


def test_user_data_writes_and_starts_the_watchdog_with_the_idle_timeout(
    user_data: tuple[str, boot.HostKey],
) -> None:
    document = yaml.safe_load(user_data[0])
    files = {f["path"]: f for f in document["write_files"]}
    assert files[boot.WATCHDOG_PATH]["content"] == boot.watchdog_script()
    assert files[boot.WATCHDOG_PATH]["permissions"] == "0755"
    assert "ClientAliveInterval" in files[boot.SSHD_DROPIN_PATH]["content"]
    started = [" ".join(c) for c in document["runcmd"] if boot.WATCHDOG_PATH in " ".join(c)]
    assert len(started) == 1
    assert f"{boot.WATCHDOG_PATH} 90 22 10 90 " in started[0]  # first client: same bound


# ── the watchdog itself, in a sandbox ──────────────────────────────────────────────────


def _watchdog_box(
    directory: Path, port: int, idle: int = 1, first: int | None = None
) -> tuple[Sandbox, Path]:
    """(With ``directory/home/KEEP_FILE`` as the watchdog's keep file.)"""
    """The watchdog in a sandbox, with `sleep` counting its rounds in ``counter``."""
    tools = directory / "bin"
    tools.mkdir(parents=True)
    counter = directory / "rounds"
    (tools / "sleep").write_text(f'#!/bin/sh\necho . >> {counter}\nexec /bin/sleep "$@"\n')
    (tools / "logger").write_text("#!/bin/sh\nexit 0\n")  # keep the host's syslog out of it
    for tool in tools.iterdir():
        tool.chmod(0o755)
    script = directory / "watchdog"
    script.write_text(boot.watchdog_script())
    bounds = f"{idle} {port} 1" + ("" if first is None else f" {first}")
    main = (
        f"PATH={tools}:/usr/sbin:/usr/bin:/sbin:/bin\nexport PATH\n"
        f"SKYWARD_WATCHDOG_KEEP={directory / 'home' / boot.KEEP_FILE} "
        f"SKYWARD_WATCHDOG_LOG={directory / 'watchdog.log'} sh {script} {bounds}\n"
    )
    return Sandbox(directory / "box", main), counter


def _rounds(counter: Path) -> int:
    return len(counter.read_text()) if counter.exists() else 0


@pytest.mark.timeout(60)
def test_watchdog_powers_off_when_no_client_is_connected(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        sandbox, _ = _watchdog_box(tmp_path, listener.getsockname()[1])
        try:
            assert sandbox.wait(30) == 0
            assert sandbox.power_state() == "poweroff"
        finally:
            sandbox.stop()
    # Kept on the machine: why it went, for whoever looks at its disk or console later.
    said = (tmp_path / "watchdog.log").read_text()
    assert "no SSH client for" in said and "powering off" in said.splitlines()[-1]


@pytest.mark.timeout(90)
def test_watchdog_never_stops_a_machine_whose_client_is_attached(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        sandbox, counter = _watchdog_box(tmp_path, listener.getsockname()[1], idle=1)
        try:
            # Five rounds of one second each: well past the idle bound, still running.
            end = time.monotonic() + 40
            while _rounds(counter) < 5 and sandbox.alive and time.monotonic() < end:
                time.sleep(0.1)
            assert sandbox.alive, sandbox.power_state()
            assert _rounds(counter) >= 5
            client.close()
            accepted.close()
            assert sandbox.wait(30) == 0
            assert sandbox.power_state() == "poweroff"
        finally:
            client.close()
            accepted.close()
            sandbox.stop()


@pytest.mark.timeout(90)
def test_watchdog_waits_longer_for_the_first_client_then_keeps_the_idle_bound(
    tmp_path: Path,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        sandbox, counter = _watchdog_box(tmp_path, port, idle=1, first=600)
        try:
            # Five rounds without any client: past the idle bound, within the first one.
            end = time.monotonic() + 40
            while _rounds(counter) < 5 and sandbox.alive and time.monotonic() < end:
                time.sleep(0.1)
            assert sandbox.alive, sandbox.power_state()
            client = socket.create_connection(listener.getsockname())
            accepted, _ = listener.accept()
            seen = _rounds(counter)
            while _rounds(counter) < seen + 2 and time.monotonic() < end:
                time.sleep(0.1)  # the watchdog has seen the client
            client.close()
            accepted.close()
            assert sandbox.wait(30) == 0  # now the idle bound (1 s) applies
            assert sandbox.power_state() == "poweroff"
        finally:
            sandbox.stop()


def _uptime() -> int:
    return int(float(Path("/proc/uptime").read_text().split()[0]))


@pytest.mark.timeout(90)
def test_watchdog_keeps_a_machine_warm_past_the_idle_bound_then_ends_it(tmp_path: Path) -> None:
    keep = tmp_path / "home" / boot.KEEP_FILE
    keep.parent.mkdir()
    # What the pool's close runs as the login user (keep_command), here with HOME there.
    written = subprocess.run(
        ["sh", "-c", boot.keep_command(6)],
        env={"HOME": str(keep.parent), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert written.returncode == 0, written.stderr
    until = int(keep.read_text())
    assert _uptime() + 4 <= until <= _uptime() + 7
    with socket.create_server(("127.0.0.1", 0)) as listener:
        sandbox, _ = _watchdog_box(tmp_path, listener.getsockname()[1], idle=1)
        try:
            assert sandbox.wait(60) == 0
            assert sandbox.power_state() == "poweroff"
        finally:
            sandbox.stop()
    assert _uptime() >= until  # not before its time, though idle for 1 s was the bound
    said = (tmp_path / "watchdog.log").read_text()
    assert "kept warm for" in said and "no pool came for it: powering off" in said, said


def test_the_adopting_pool_lifts_the_keep(tmp_path: Path) -> None:
    (tmp_path / boot.KEEP_FILE).write_text("123\n")
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    subprocess.run(["sh", "-c", boot.unkeep_command()], env=env, check=True)
    assert not (tmp_path / boot.KEEP_FILE).exists()


def test_the_boot_payload_points_the_watchdog_at_the_login_users_keep_file() -> None:
    payload = boot.Boot(
        host_key=boot.HostKey.generate(),
        authorized_key=_CLIENT_KEY,
        user="skyward",
        idle_timeout=90,
    )
    runcmd = " ".join(" ".join(c) for c in yaml.safe_load(payload.cloud_config())["runcmd"])
    for text in (runcmd, payload.start_script()):
        assert (
            'env SKYWARD_WATCHDOG_KEEP="$(getent passwd skyward | cut -d: -f6)/'
            f'{boot.KEEP_FILE}" {boot.WATCHDOG_PATH} 90 22 10 90' in text
        )


# ── the release: a machine ending its own billing ────────────────────────────────────────


class _CloudAnswers:
    """A metadata server and a cloud API in one local server: the token, this machine's
    name, and DELETEs answered with the statuses a test queues (then 200)."""

    def __init__(self, token: bool = True) -> None:
        self.statuses: list[int] = []
        self.deletes: list[str] = []
        answers = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/meta/token" and token:
                    self._answer(200, b'{"access_token": "t0k", "expires_in": 3599}')
                elif self.path == "/meta/name":
                    self._answer(200, b"vm-7")
                else:
                    self._answer(404, b"not found")

            def do_DELETE(self) -> None:
                assert self.headers["Authorization"] == "Bearer t0k"
                answers.deletes.append(self.path)
                self._answer(answers.statuses.pop(0) if answers.statuses else 200, b"{}")

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def release(self, tmp_path: Path) -> subprocess.CompletedProcess[str]:
        script = tmp_path / "release"
        script.write_text(
            boot.release_script(
                metadata=f"{self.url}/meta",
                header="Metadata: true",
                token="token",
                find="name=$(metadata name)",
                steps=[("DELETE", f"{self.url}/api/machines/$name", "deleting $name")],
                pause=0,
            )
        )
        return subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=60)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("hiccups", [[503], [429, 500]])
def test_a_release_the_cloud_did_not_answer_is_tried_again(
    tmp_path: Path, hiccups: list[int]
) -> None:
    # Given up at once, the machine would power off and stay billed until `skyward down`.
    cloud = _CloudAnswers()
    cloud.statuses = list(hiccups)
    try:
        done = cloud.release(tmp_path)
    finally:
        cloud.close()
    assert done.returncode == 0, done.stderr
    assert cloud.deletes == ["/api/machines/vm-7"] * (len(hiccups) + 1)
    said = done.stderr.splitlines()
    assert said[:2] == [
        "skyward-release: deleting vm-7",
        f"skyward-release: refused (HTTP {hiccups[0]})",
    ]
    assert said[-2:] == ["skyward-release: deleting vm-7", "skyward-release: accepted (HTTP 200)"]


def test_a_release_refused_for_good_or_never_answered_ends_in_failure(tmp_path: Path) -> None:
    cloud = _CloudAnswers()
    try:
        cloud.statuses = [403]  # no permission: another round cannot help
        refused = cloud.release(tmp_path)
        assert (refused.returncode, len(cloud.deletes)) == (1, 1), refused.stderr
        cloud.deletes.clear()
        cloud.statuses = [500] * boot.RELEASE_TRIES
        failing = cloud.release(tmp_path)
        assert (failing.returncode, len(cloud.deletes)) == (1, boot.RELEASE_TRIES)
    finally:
        cloud.close()
    assert "refused (HTTP 403)" in refused.stderr
    assert "trying again" not in refused.stderr


def test_a_release_without_a_token_is_tried_again_then_fails(tmp_path: Path) -> None:
    cloud = _CloudAnswers(token=False)
    try:
        done = cloud.release(tmp_path)
    finally:
        cloud.close()
    assert done.returncode == 1
    assert cloud.deletes == []
    assert done.stderr.count("no token from the metadata server") == boot.RELEASE_TRIES


# ── the client's address ───────────────────────────────────────────────────────────────


@pytest.fixture
def address_server() -> Iterator[tuple[str, list[bytes]]]:
    """A local stand-in for checkip: answers with what the test puts in the list."""
    answers: list[bytes] = [b"10.123.7.9\n"]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(answers[0])

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", answers
    finally:
        server.shutdown()
        server.server_close()


def test_auto_cidr_is_the_address_the_lookup_sees(
    address_server: tuple[str, list[bytes]],
) -> None:
    url, answers = address_server
    assert options.client_cidr("auto", lookup_url=url) == "10.123.7.9/32"
    answers[0] = b"2001:db8::7"
    assert options.client_cidr("auto", lookup_url=url) == "2001:db8::7/128"


def test_a_given_cidr_is_normalised_and_needs_no_lookup() -> None:
    assert options.client_cidr("203.0.113.7/24", lookup_url="http://127.0.0.1:9/") == (
        "203.0.113.0/24"
    )


def test_a_lookup_that_fails_says_to_pass_ssh_cidr(address_server: tuple[str, list[bytes]]) -> None:
    url, answers = address_server
    answers[0] = b"<html>captive portal</html>"
    with pytest.raises(ProvisionError, match="ssh_cidr="):
        options.client_cidr("auto", lookup_url=url)
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(ProvisionError, match="ssh_cidr="):
        options.client_cidr("auto", lookup_url=f"http://127.0.0.1:{port}/", timeout=5)


# ── create, then open, or destroy ──────────────────────────────────────────────────────


class _Recording(Allocation):
    def __init__(self, fail_release: bool = False) -> None:
        super().__init__([])
        self.released = 0
        self.fail_release = fail_release

    def release(self) -> None:
        self.released += 1
        if self.fail_release:
            raise ProvisionError("security group sg-1 is still in use")


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError, ProvisionError])
def test_a_failed_build_destroys_what_it_recorded_and_reraises(error: type[BaseException]) -> None:
    allocation = _Recording()

    def build(made: _Recording) -> None:
        made.resources.append(Resource("key pair", "skyward-p"))
        raise error("stop")

    with pytest.raises(error):
        cloud_start.open_or_destroy(allocation, build)
    assert allocation.released == 1
    assert allocation.terminated


def test_a_failed_cleanup_is_told_with_the_original_error() -> None:
    allocation = _Recording(fail_release=True)

    def build(made: _Recording) -> None:
        raise RuntimeError("capacity")

    with pytest.raises(RuntimeError) as caught:
        cloud_start.open_or_destroy(allocation, build)
    assert any("sg-1 is still in use" in note for note in caught.value.__notes__)


def test_a_successful_build_keeps_everything() -> None:
    allocation = _Recording()
    assert cloud_start.open_or_destroy(allocation, lambda made: None) is allocation
    assert allocation.released == 0


@pytest.mark.timeout(30)
def test_ctrl_c_during_the_cleanup_of_a_failed_start_waits_for_the_cleanup_to_finish() -> None:
    # On Python 3.11 an interrupted Thread.join marks a running thread as stopped: a wait
    # built on join would return here while the clean-up is still deleting things.
    started, may_end = threading.Event(), threading.Event()
    finished: list[str] = []

    class Slow(Allocation):
        def release(self) -> None:
            started.set()
            may_end.wait(20)
            finished.append("released")

    main = threading.get_ident()

    def press_ctrl_c_three_times() -> None:
        assert started.wait(20)
        for _ in range(3):
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.3)
        may_end.set()

    presser = threading.Thread(target=press_ctrl_c_three_times)
    presser.start()

    def build(made: Slow) -> None:
        raise RuntimeError("no capacity")

    try:
        with pytest.raises(RuntimeError, match="no capacity"):
            cloud_start.open_or_destroy(Slow([]), build)
        assert finished == ["released"]
    finally:
        may_end.set()
        presser.join(20)


def test_the_first_client_is_waited_for_its_own_bound_not_the_idle_one() -> None:
    key = boot.HostKey.generate()
    text = boot.user_data(
        host_key=key,
        authorized_key=_CLIENT_KEY,
        idle_timeout=1800,
        first_client_timeout=boot.first_client_bound(600),
    )
    started = [" ".join(c) for c in yaml.safe_load(text)["runcmd"] if boot.WATCHDOG_PATH in c[-1]]
    # A client killed before it ever connected costs boot_timeout + 2 min, not 30 min.
    assert f"{boot.WATCHDOG_PATH} 1800 22 10 720 " in started[0]


# ── a port that accepts and never speaks ───────────────────────────────────────────────


@pytest.mark.timeout(60)
def test_a_silent_ssh_port_is_retried_within_boot_timeout_then_named() -> None:
    from skyward.client.futures import Deadline
    from skyward.providers.ssh.connection import Target
    from skyward.providers.ssh.hosts import Access, HostTarget, connect

    accepted: list[socket.socket] = []
    with socket.create_server(("127.0.0.1", 0)) as server:

        def accept() -> None:
            while True:
                try:
                    connection, _ = server.accept()
                except OSError:
                    return
                accepted.append(connection)  # held open, never a byte: no SSH banner

        threading.Thread(target=accept, daemon=True).start()
        target = HostTarget(
            Target("127.0.0.1", server.getsockname()[1], "me"),
            host_key=boot.HostKey.generate().public,
        )
        started = time.monotonic()
        with pytest.raises(ProvisionError) as caught:
            connect(target, Access(boot_timeout=4, connect_timeout=1.5), Deadline(30, "test"))
        took = time.monotonic() - started
    for connection in accepted:
        connection.close()
    message = str(caught.value)
    assert "accepted the connection but no SSH server answered" in message
    assert "still failing after 4 s of retries" in message
    assert len(accepted) >= 2, "retried, as a refused port is"
    assert 3 < took < 15


def test_the_pool_reports_its_approximate_cost_at_close() -> None:
    from support.clouds.aws.pools import request
    from support.reporter import Recorder

    from skyward.pool.machines import Machines

    class Priced:
        kind = "priced"

        def check(self, request: object) -> None:
            pass

        def provision(self, request: object, reporter: object) -> Allocation:
            made = Allocation([])
            made.hourly_cost, made.describe = 3.6, "2 x m7i.xlarge on-demand in us-east-1a"
            return made

        def inventory(self) -> None:
            return None

    recorder = Recorder()
    machines = Machines(Priced(), pool="p", reporter=recorder)
    machines.provision(request(nodes=0), 0)
    machines.terminate()
    (line,) = [s for s in recorder.statuses if "about $" in s]
    assert line.startswith("pool p: about $0.00 for 0.0 min at about $3.60/h (2 x m7i.xlarge")


def _request(**sizes: Any) -> ProvisionRequest:
    return ProvisionRequest(
        pool="p",
        nodes=1,
        accelerator=None,
        image=sky.Image(),
        tags={},
        deadline=Deadline(60, "the test"),
        **sizes,
    )


def test_every_cloud_describes_a_named_type_its_catalog_lacks_and_refuses_it_when_small() -> None:
    facts = {"accelerator": None, "count": 0, "memory_gb": 0, "vcpus": 2, "ram_gb": 8.0}
    for config, option in (
        (sky.AWS(region="us-east-1", instance_type="m7g.large"), "instance_type"),
        (
            sky.GCP(project="proj-1", zone="us-central1-a", machine_type="e2-standard-2"),
            "machine_type",
        ),
        (sky.Azure(location="eastus", vm_size="Standard_D2s_v5"), "vm_size"),
    ):
        (machine,) = config.described(_request(vcpus=2), **facts)
        assert (machine.cloud, machine.type, machine.ram_gb) == (
            config.kind,
            getattr(config, option),
            8.0,
        )
        with pytest.raises(ValueError, match=f"{option}=.* has 2 vCPUs, fewer than vcpus=8"):
            config.described(_request(vcpus=8), **facts)
        with pytest.raises(ValueError, match=f"{option}=.* has 8 GB of memory"):
            config.described(_request(memory_gb=16), **facts)

"""A process tree that cannot power off or reboot this machine, and says when it tried.

::

    unshare --pid --fork --kill-child --mount --mount-proc --uts [under nsenter --net=NS]
      └ sh (PID 1 of its own PID namespace)
          1. refuses to go on unless it is PID 1 (so the rest never runs on the host)
          2. makes every mount private, then bind-mounts the shim over poweroff, shutdown,
             halt, reboot and systemctl, and checks that each now *is* the shim
          3. runs the script it was given; waits for it
      shim    writes what was asked ("poweroff", "reboot") to the sandbox's state file and
              sends SIGTERM to PID 1, whose trap exits: the kernel then kills everything
              in the namespace. Outside a sandbox it refuses and does nothing.

Even a real ``poweroff -f`` here only signals PID 1: ``reboot(2)`` from a PID namespace
other than the first one ends that namespace (Linux >= 3.4), never the machine. The trap
records it as ``signal-INT`` / ``signal-HUP``.

Cloud stand-ins (``clouds/aws/standins.py``) run as sandboxes; so does the watchdog's own test.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

# Every path a watchdog or a user might call to stop the machine. On merged-/usr Debian the
# /sbin ones are symlinks into /usr/sbin and those into systemctl; a bind mount follows the
# symlink, so several land on the same file, which is fine.
GUARDED = (
    "/sbin/poweroff",
    "/usr/sbin/poweroff",
    "/sbin/shutdown",
    "/usr/sbin/shutdown",
    "/sbin/halt",
    "/usr/sbin/halt",
    "/sbin/reboot",
    "/usr/sbin/reboot",
    "/bin/systemctl",
    "/usr/bin/systemctl",
)


def host_pid_namespace() -> str:
    return os.readlink("/proc/self/ns/pid")


def shim_script(state: Path, host_pidns: str) -> str:
    """The stand-in for poweroff & co. ``state`` is where it records what was asked."""
    return f"""#!/bin/sh
# skyward test sandbox shim: never powers off the machine; ends its sandbox instead.
# Only in a PID namespace other than the host's is PID 1 the sandbox's own init. Unreadable
# counts as the host's: the check fails closed.
own=$(readlink /proc/self/ns/pid 2>/dev/null)
if [ -z "$own" ] || [ "$own" = {shlex.quote(host_pidns)} ]; then
    echo "sandbox shim: not inside a sandbox's PID namespace; refusing" >&2
    exit 3
fi
name=$(basename "$0")
[ "$name" = systemctl ] && {{ name=$1; shift; }}
case $name in
    poweroff|halt) action=poweroff ;;
    shutdown)
        action=poweroff
        for arg in "$@"; do
            case $arg in -r|--reboot) action=reboot ;; -c) exit 0 ;; esac
        done ;;
    reboot|kexec) action=reboot ;;
    *) echo "System has not been booted with systemd as init system (PID 1)." >&2
       exit 1 ;;
esac
echo "$action" > {shlex.quote(str(state))}
kill -TERM 1
sleep 5
"""


def prelude(shim: Path, state: Path) -> str:
    """The first lines PID 1 runs: the guard, then the shim mounts, then the traps."""
    paths = " ".join(shlex.quote(p) for p in GUARDED)
    shim_q, state_q = shlex.quote(str(shim)), shlex.quote(str(state))
    return f"""
[ "$$" = 1 ] || {{ echo "sandbox: not PID 1 of a new PID namespace; refusing" >&2; exit 70; }}
mount --make-rprivate / || exit 71
for path in {paths}; do
    [ -e "$path" ] || continue
    mount --bind {shim_q} "$path" || exit 72
done
for path in {paths}; do
    [ -e "$path" ] || continue
    cmp -s {shim_q} "$path" || {{ echo "sandbox: $path is not the shim" >&2; exit 73; }}
done
end() {{ [ -s {state_q} ] || echo "signal-$1" > {state_q}; exit 0; }}
trap 'end TERM' TERM
trap 'end INT' INT
trap 'end HUP' HUP
"""


def guard_again(shim: Path) -> str:
    """Lines that bind the shim again over the guarded paths in ``/usr/bin``, for a script
    that mounts something over ``/usr/bin`` itself (a ``HostImage`` overlay hides the mounts
    the prelude made there); they stop the script if a path is then not the shim."""
    paths = " ".join(shlex.quote(p) for p in GUARDED if p.startswith(("/usr/bin/", "/bin/")))
    shim_q = shlex.quote(str(shim))
    return f"""for path in {paths}; do
    [ -e "$path" ] || continue
    mount --bind {shim_q} "$path" || exit 72
    cmp -s {shim_q} "$path" || {{ echo "sandbox: $path is not the shim" >&2; exit 73; }}
done
"""


class Sandbox:
    """``script`` run as a sandbox's main process; the sandbox ends when it does, or when
    something in it powers off. ``directory`` holds the shim and the state file."""

    def __init__(
        self,
        directory: Path,
        script: str,
        *,
        netns: str | None = None,
        log: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.state = directory / "power-state"
        self.state.unlink(missing_ok=True)
        self.shim = directory / "shim"
        self.shim.write_text(shim_script(self.state, host_pid_namespace()))
        self.shim.chmod(0o755)
        main = directory / "main.sh"
        main.write_text(script)
        init = directory / "init.sh"
        init.write_text(
            prelude(self.shim, self.state)
            + f"sh {shlex.quote(str(main))} &\nmain=$!\nwait $main\nexit $?\n"
        )
        command = [
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount",
            "--mount-proc",
            "--uts",
            "sh",
            str(init),
        ]
        if netns is not None:
            command = ["nsenter", f"--net=/run/netns/{netns}", *command]
        output = open(log or directory / "sandbox.log", "ab")  # noqa: SIM115 - the child owns it
        try:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        finally:
            output.close()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def power_state(self) -> str:
        """What powered the sandbox off ("poweroff", "reboot", "signal-INT"), or ""."""
        try:
            return self.state.read_text().strip()
        except FileNotFoundError:
            return ""

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        """Kill it (its PID 1 dies with ``unshare``, and the namespace with PID 1)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

"""What a test host's system looks like: this machine's ``/usr/bin``, changed the way a stock
cloud image differs from it, inside the host's own mount namespace only.

::

    this machine (Debian 12)                 a host with HostImage(python="3.12", unzip=False)
    ───────────────────────────────          ────────────────────────────────────────────────
    /usr/bin/python3 -> python3.11           /usr/bin = overlay: this machine's /usr/bin below,
    /usr/bin/python3.11, pip, pip3,            above it python3 and python3.12 -> a CPython
      unzip, zipinfo, ...                      3.12 copy with no pip and no ensurepip, and
    /usr/lib/python3/dist-packages             whiteouts for every other python*, pip* and
      (ensurepip works: python3-venv)          unzip*; plus the ``tools`` the test asks for
                                               (a fake nvidia-smi, sudo, apt-get)

Stock Ubuntu 24.04 (Canonical's AMI, and the Deep Learning AMIs built on it) ships
``/usr/bin/python3`` = 3.12 and nothing else: no ``python3.11``, no pip, and no
``python3.12-venv``, so ``python3 -m venv`` fails for want of ensurepip; it has curl, wget,
gzip and coreutils, and no unzip. ``HostImage(python="3.12", unzip=False)`` is that host.
``python=None`` is a host with no Python at all (a minimal container image).

The CPython copy is ``pythons.build_install_only``'s relocatable archive of pyenv's newest 3.12,
unpacked once (cached across runs under ``/var/tmp``) and shared read-only by the hosts;
``lib/python3.12/ensurepip`` is deleted from it, and it carries no site-packages. ``/bin``
is a link to ``usr/bin`` here (merged /usr), so the overlay covers both. The hosts' users
cannot read ``/root``, so pyenv's own interpreters are out of their reach either way.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from support.pythons import _locked, build_install_only

# Where the hosts' Pythons are unpacked: outside /root, which the hosts' user cannot read.
SHARED = Path("/var/tmp/skyward-tests-pythons")
_RECIPE = 1  # bump when the copy is made differently


@dataclass(frozen=True)
class HostImage:
    """``python``: ``"system"`` (this machine's, as it is), a minor version (``"3.12"``: the
    only Python, no pip, no ensurepip) or None (none at all). ``unzip``: whether ``unzip``
    stays. ``tools``: more executables in ``/usr/bin``, name -> script text. ``hidden``:
    more of this machine's ``/usr/bin`` the host does not have (``("s3fs",)``: a stock
    image, on a machine where the tests installed it). ``sftp``: whether its sshd offers the
    SFTP subsystem (some hardened hosts and appliances do not)."""

    python: str | None = "system"
    unzip: bool = True
    tools: Mapping[str, str] = field(default_factory=dict)
    hidden: tuple[str, ...] = ()
    sftp: bool = True

    def prepare(self, directory: Path) -> str:
        """Lay out this image's files under ``directory``; the shell lines that mount it, to
        run as root in the host's own mount namespace (after ``mount --make-rprivate /``)."""
        if self.python == "system" and self.unzip and not self.tools and not self.hidden:
            return ""
        # The upper and work directories must be on a file system overlayfs accepts as the
        # upper layer: a tmpfs of the host's own. They are made inside the namespace.
        upper = directory / "overlay" / "upper"
        work = directory / "overlay" / "work"
        lines = [f"mount -t tmpfs tmpfs {shlex.quote(str(directory / 'overlay'))}"]
        lines.append(f"mkdir {shlex.quote(str(upper))} {shlex.quote(str(work))}")
        (directory / "overlay").mkdir(parents=True, exist_ok=True)
        hidden = self._hidden()
        for name in hidden:
            lines.append(f"mknod {shlex.quote(str(upper / name))} c 0 0")  # a whiteout
        if self.python not in ("system", None):
            python = _python_copy(self.python)
            for name in ("python3", f"python{self.python}"):
                if name in hidden:
                    lines.append(f"rm {shlex.quote(str(upper / name))}")
                target = python / "bin" / f"python{self.python}"
                lines.append(f"ln -s {shlex.quote(str(target))} {shlex.quote(str(upper / name))}")
        tools = directory / "tools"
        tools.mkdir(exist_ok=True)
        for name, text in self.tools.items():
            (tools / name).write_text(text)
            (tools / name).chmod(0o755)
            if name in hidden:
                lines.append(f"rm {shlex.quote(str(upper / name))}")
            lines.append(f"ln -s {shlex.quote(str(tools / name))} {shlex.quote(str(upper / name))}")
        lines.append(
            "mount -t overlay overlay -o "
            + shlex.quote(f"lowerdir=/usr/bin,upperdir={upper},workdir={work}")
            + " /usr/bin"
        )
        return "\n".join(f"{line} || exit 1" for line in lines) + "\n"

    def _hidden(self) -> list[str]:
        """The entries of this machine's /usr/bin this image does not have."""
        hidden = []
        for name in sorted(os.listdir("/usr/bin")):
            if name.startswith(("python", "pip", "pydoc")) or "-python" in name:
                if self.python != "system":
                    hidden.append(name)
            elif name.startswith(("unzip", "funzip", "zipinfo", "zipgrep")):
                if not self.unzip:
                    hidden.append(name)
            elif name in ("uv", "uvx") or name in self.hidden:
                hidden.append(name)
        return hidden


def _python_copy(minor: str) -> Path:
    """A relocatable CPython ``minor`` without ensurepip, unpacked once (across runs) where
    the hosts' user can read it; its prefix."""
    build = build_install_only(minor)
    target = SHARED / f"{build.version}-r{_RECIPE}"
    with _locked(SHARED / f".{build.version}.lock"):
        if not (target / "python" / "bin").exists():
            scratch = SHARED / f".{build.version}.part"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(parents=True)
            with tarfile.open(build.archive) as archive:
                archive.extractall(scratch, filter="tar")
            # Ubuntu's python3.12 without python3.12-venv: no ensurepip, so no `-m venv`.
            shutil.rmtree(scratch / "python" / "lib" / f"python{minor}" / "ensurepip")
            for path in [SHARED, *scratch.rglob("*")]:
                if path.is_dir() and not path.is_symlink():
                    path.chmod(0o755)
            scratch.rename(target)
    return target / "python"


# ── tools a test may put on a host ─────────────────────────────────────────────────────────


def fake_nvidia_smi(gpus: int, name: str = "NVIDIA A10G") -> str:
    """``nvidia-smi`` that lists ``gpus`` GPUs for ``-L``, as the real one prints them."""
    listing = "".join(
        f"GPU {i}: {name} (UUID: GPU-00000000-0000-0000-0000-00000000000{i})\\n"
        for i in range(gpus)
    )
    return f'#!/bin/sh\n[ "$1" = -L ] || exit 9\nprintf "{listing}"\n'


# ``sudo -n CMD...`` that runs CMD as the same user: the script's password-less-sudo check
# passes, and nothing on this machine is touched as root.
FAKE_SUDO = '#!/bin/sh\n[ "$1" = -n ] && shift\nexec "$@"\n'


def fake_apt_get(log: Path, busy: int) -> str:
    """``apt-get`` that records each call in ``log`` and says another process holds the
    lock for the first ``busy`` calls, as apt does while unattended-upgrades runs."""
    q = shlex.quote(str(log))
    return (
        "#!/bin/sh\n"
        f'echo "$*" >> {q}\n'
        f'if [ "$(wc -l < {q})" -le {busy} ]; then\n'
        '  echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242'
        ' (unattended-upgr)" >&2\n'
        "  exit 100\n"
        "fi\n"
        'echo "apt-get $*: done"\n'
    )

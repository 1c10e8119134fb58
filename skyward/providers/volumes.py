"""Mounting a pool's volumes on a node, and unmounting them: two POSIX sh scripts, run on the
node over its SSH connection (``ssh/hosts.py``) or on this machine (``local.py``).

::

    open_hosts: connect → bootstrap → upload → GPUs → mount(volumes) → HostNode
    Local.provision:                                  mount(volumes) → LocalAllocation
    ...the workers run, and see the buckets as directories...
    HostNode.close / LocalAllocation.release: kill the workers → unmount(volumes)

``mount``: s3fs is installed with apt-get when the node lacks it (as root or with
password-less sudo, waiting while another apt holds its lock, like the bootstrap's apt
packages); each mount point is made if missing and must be empty; each bucket is mounted with
``s3fs`` and listed once, so that a wrong bucket, endpoint or credential fails the start with
s3fs's own reason instead of failing the first call that reads it. A failure unmounts what
the script mounted before it. ``unmount``: ``fusermount -u`` (lazily when a process still
holds a file there), the mount point removed if the script made it, the credential files
deleted.

The scripts travel on the shell's stdin, so the secret keys they carry are never in a
command line (``ps`` on the node) or in what the node prints.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from skyward._errors import BootstrapError
from skyward.client.volume import Volume
from skyward.providers.ssh.bootstrap import ERROR, apt_install, shell_path

# How the scripts say which volume failed: the client puts the line in the error's first line.
FAILED = ERROR


@dataclass(frozen=True)
class Mounts:
    """What a node's close needs to unmount its volumes: them, and the directory (a shell
    word) that holds their files."""

    volumes: tuple[Volume, ...]
    directory: str


def volume_dir(workdir: str, pool: str) -> str:
    """Where a pool's credential files, logs and notes live on a node (a shell word)."""
    return f"{shell_path(workdir)}/volumes/{shlex.quote(pool)}"


def mount_script(volumes: Sequence[Volume], directory: str, *, instance_profile: bool) -> str:
    """The script that mounts ``volumes`` on a node; ``directory`` (a shell word) holds its
    files. ``instance_profile``: volumes without keys use the node's instance profile (EC2
    nodes started with one); otherwise s3fs looks for the host's own credential files."""
    q = shlex.quote
    lines = [
        "set -eu",
        f"dir={directory}",
        'mkdir -p "$dir" && chmod 700 "$dir"',
        'env_dir="$dir/apt"',
        'step() { printf "%s\\n" "$*"; }',
        "mounted=''",
        # On any failure, what this script mounted goes again: the node is left as it was.
        'cleanup() { for m in $mounted; do fusermount -uz "$m" 2>/dev/null ||'
        ' umount -l "$m" 2>/dev/null || true; done; }',
        "trap 'status=$?; [ $status = 0 ] || cleanup' EXIT",
        "if ! command -v s3fs >/dev/null 2>&1; then",
        '  echo "skyward: this node has no s3fs; installing it (the pool has volumes)"',
        *("  " + line for line in apt_install(["s3fs"], "the pool's volumes need s3fs")),
        "fi",
        "if ! command -v s3fs >/dev/null 2>&1; then",
        f'  echo "{FAILED}s3fs is still missing after installing the s3fs package; install'
        ' s3fs-fuse on the node" >&2',
        "  exit 127",
        "fi",
        'if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo -n"; fi',
    ]
    for number, volume in enumerate(volumes):
        where = q(volume.mount)
        source = volume.bucket_name + (f":/{volume.prefix}" if volume.prefix else "")
        options = [
            f'logfile="$dir"/{number}.log',
            "dbglevel=err",
            # Objects uploaded by other tools carry no POSIX mode: show them readable.
            "complement_stat",
            "umask=022",
            'uid="$(id -u)"',
            'gid="$(id -g)"',
        ]
        if volume.read_only:
            options.append("ro")
        if volume.endpoint_url is not None:
            options += [f"url={q(volume.endpoint_url)}", "use_path_request_style"]
        if volume.region is not None:
            options.append(f"endpoint={q(volume.region)}")
        if volume.explicit_credentials:
            assert volume.secret_access_key is not None
            secret = volume.secret_access_key.get_secret_value()
            lines += [
                f'( umask 077; printf "%s:%s\\n" {q(volume.access_key_id or "")} {q(secret)}'
                f' > "$dir"/{number}.passwd )',
            ]
            options.append(f'passwd_file="$dir"/{number}.passwd')
        elif instance_profile:
            options.append("iam_role=auto")
        what = f"{volume.bucket} at {volume.mount}"
        lines += [
            f"if [ ! -d {where} ]; then",
            f"  if mkdir -p {where} 2>/dev/null ||"
            f' {{ $sudo mkdir -p {where} && $sudo chown "$(id -u):$(id -g)" {where}; }}'
            " 2>/dev/null; then",
            f'    echo {where} > "$dir"/{number}.made',
            "  else",
            f'    echo "{FAILED}cannot make the mount point {volume.mount} (not writable by'
            ' $(id -un), and no password-less sudo)" >&2',
            "    exit 73",
            "  fi",
            "fi",
            f"if mountpoint -q {where} 2>/dev/null; then",
            f'  echo "{FAILED}{volume.mount} is already a mount point on this node" >&2',
            "  exit 73",
            "fi",
            f'if [ -n "$(ls -A {where} 2>/dev/null)" ]; then',
            f'  echo "{FAILED}the mount point {volume.mount} is not empty; mount the volume'
            ' somewhere empty" >&2',
            "  exit 73",
            "fi",
            f'step "s3fs {source} {volume.mount}"',
            f': > "$dir"/{number}.log',
            f'if ! s3fs {q(source)} {where} -o {",".join(options)} 2>"$dir"/{number}.err; then',
            f'  cat "$dir"/{number}.err "$dir"/{number}.log >&2 || true',
            f'  echo "{FAILED}s3fs could not mount {what}" >&2',
            "  exit 1",
            "fi",
            f'mounted="$mounted {where}"',
            # s3fs detaches before it has talked to the service: a listing says whether it
            # can (a wrong bucket or key ends the daemon, and the listing fails).
            f"if ! ls {where} >/dev/null 2>&1; then",
            f'  tail -n 20 "$dir"/{number}.log >&2 || true',
            f'  echo "{FAILED}{what} cannot be read: s3fs mounted it, then failed (a wrong'
            ' bucket, endpoint or credentials? its log is above)" >&2',
            "  exit 1",
            "fi",
            f'echo "skyward: mounted {what}{" (read-only)" if volume.read_only else ""}"',
        ]
    lines.append("")
    return "\n".join(lines)


def unmount_script(volumes: Sequence[Volume], directory: str) -> str:
    """The script that unmounts ``volumes`` and removes what ``mount_script`` made. Safe to
    run more than once, and after a partial mount."""
    q = shlex.quote
    lines = [f"dir={directory}", 'if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo -n"; fi']
    for number, volume in enumerate(volumes):
        where = q(volume.mount)
        lines += [
            f"if mountpoint -q {where} 2>/dev/null; then",
            # Lazily when busy: a worker killed a moment ago may still hold a file open.
            f"  fusermount -u {where} 2>/dev/null || umount {where} 2>/dev/null ||"
            f" fusermount -uz {where} 2>/dev/null || umount -l {where} 2>/dev/null ||"
            f' echo "skyward: could not unmount {volume.mount}" >&2',
            "fi",
            f'if [ -f "$dir"/{number}.made ] && ! mountpoint -q {where} 2>/dev/null; then',
            f"  rmdir {where} 2>/dev/null || $sudo rmdir {where} 2>/dev/null || true",
            "fi",
        ]
    lines += ['rm -rf "$dir"', ""]
    return "\n".join(lines)


def mount_failed(where: object, status: int, output: str) -> BootstrapError:
    """The error for a mount script that exited with ``status``, led by the line it gave."""
    lines = output.splitlines()
    reasons = [line[len(FAILED) :] for line in lines if line.startswith(FAILED)]
    why = reasons[-1] if reasons else f"the volume script exited with {status}"
    tail = "\n".join(lines[-20:])
    return BootstrapError(
        f"{where}: cannot mount the pool's volumes: {why}\n--- last lines of its output ---\n"
        f"{tail}",
        command="mount volumes",
        exit_status=status,
        log_tail=tail,
    )


def refuse_keyless(volumes: Sequence[Volume], cloud: str) -> None:
    """``ValueError`` for a volume without keys on machines that hold no AWS credentials of
    their own (a fresh GCP or Azure VM): s3fs would find nothing to sign with."""
    keyless = [v.bucket for v in volumes if not v.explicit_credentials]
    if keyless:
        raise ValueError(
            f"the volume {keyless[0]} has no credentials, and {cloud}'s machines have none for "
            f"S3: give the Volume access_key_id= and secret_access_key="
        )

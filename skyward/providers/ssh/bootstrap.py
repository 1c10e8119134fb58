"""The bootstrap script: a POSIX shell script, rendered from an ``Image``, that prepares a host.

``render`` is a pure function of its inputs (snapshot-tested). The script:

1. takes a lock, and leaves at once if this image's environment is already complete
   (``<workdir>/envs/<hash>/.skyward-ready``): a second pool with the same image on the
   same host installs nothing;
2. installs apt packages when it runs as root or has password-less sudo, waiting (bounded)
   while another apt, such as a first boot's unattended-upgrades, holds apt's locks;
3. finds a Python of the client's minor version (or the one ``SSH(python=...)`` names);
4. finds uv: the host's if it is new enough, else the standalone binary from the ``uv``
   wheel on the image's index, fetched once into ``<workdir>/tools/bin`` with curl, wget or
   any python3, and unpacked with unzip, any python3, or the shell alone (no pip, no venv
   module, no ensurepip: stock Debian and Ubuntu images lack them);
5. makes the virtual environment with ``uv venv``, from the host's Python when it has the
   client's version, else from a uv-managed CPython of exactly that version (downloaded
   once into ``<workdir>/pythons``, from ``Image.python_mirror`` if set);
6. writes the image's local wheel files, which travel inside the script, into
   ``<workdir>/wheels/<sha256>/``, checks that ``git`` exists if a requirement comes from
   git, and installs the requirements with ``uv pip install``: ``index_url`` (if set)
   replaces the default index everywhere, and each ``PipIndex`` serves only the packages it
   names, and those are installed (pinned to it). Direct references
   (``name @ git+https://...``, wheels) come from where they point, whatever index scoping
   says;
7. runs the ``setup`` commands with the image's ``env`` and the environment on ``PATH``;
8. marks the environment complete.

Before each command it prints ``::skyward:: <command>``, so the client can name the command
that failed; everything else it prints is the commands' own output, and ``skyward: ...``
notes. A line ``skyward: error: ...`` says why it stops; the client's ``BootstrapError``
leads with it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from skyward._image import Image, local_wheel, requirement_name
from skyward.client.phases import BOOTSTRAP_STEPS

# volumes.py takes shell_path from here, with the bootstrap's other shell pieces.
from skyward.providers.shell import shell_path as shell_path

MARKER = "::skyward:: "
# ``::skyward-step:: uv``: the script enters one of ``STEPS`` (the client reports it as the
# node's bootstrap step, and times it).
STEP = "::skyward-step:: "
# ``::skyward-cache:: <state>``: what the environment cache does on this node; the client
# reads it to let one node of a pool build a missing entry while the others wait
# (``providers/envcache/turns.py``). States: ``hit``, ``wait`` (a miss, and this node was
# told to wait for the pool's builder), ``building`` (a miss; this node builds and can
# write the cache), ``unwritable`` (a miss; it builds and cannot write it), ``off`` (no
# zstd or python3 here to use it), ``published`` or ``unpublished`` (after the build).
CACHE = "::skyward-cache:: "


@dataclass(frozen=True)
class Wheel:
    """A wheel file of the client's that the script carries to the host."""

    requirement: str  # as the image has it: "name[extras] @ file:///...whl; marker"
    filename: str
    sha256: str
    data: bytes

    @property
    def host_dir(self) -> str:
        """Its directory under the workdir on the host (by content: images share it)."""
        return f"wheels/{self.sha256[:16]}"


@functools.lru_cache(maxsize=32)
def _read_wheel(path: Path, mtime_ns: int, size: int) -> tuple[str, bytes]:
    data = path.read_bytes()
    return hashlib.sha256(data).hexdigest(), data


def _wheel(requirement: str, path: Path) -> Wheel:
    stat = path.stat()
    sha256, data = _read_wheel(path, stat.st_mtime_ns, stat.st_size)
    return Wheel(requirement, path.name, sha256, data)


@dataclass(frozen=True)
class Plan:
    """Everything the script depends on; its hash names the environment."""

    image: Image
    python_version: str  # "3.11": what cloudpickle needs on both ends
    python: str | None  # an interpreter the user named, else found by version
    workdir: str  # "~/.cache/skyward" or an absolute path
    runtime: tuple[str, ...]  # what the worker itself needs, pinned to the client's versions

    @property
    def requirements(self) -> tuple[str, ...]:
        named = {requirement_name(r) for r in self.image.pip}
        return self.image.pip + tuple(r for r in self.runtime if requirement_name(r) not in named)

    @property
    def installs(self) -> tuple[str, ...]:
        """The requirements, and every package a ``PipIndex`` names that they do not.

        uv pins a package to an index only when it is a direct requirement, and the jax
        plugin scopes an index to jaxlib and the CUDA plugins, which jax pulls in: naming
        them makes them direct, so they come from that index. (Their versions still follow
        what the requirements ask for.)
        """
        direct = {requirement_name(r) for r in self.requirements}
        named = [p for index in self.image.pip_indexes for p in index.packages]
        return self.requirements + tuple(dict.fromkeys(p for p in named if p not in direct))

    @property
    def wheels(self) -> tuple[Wheel, ...]:
        """The local wheel files the requirements name, read (once per file version)."""
        found = ((r, local_wheel(r)) for r in self.installs)
        return tuple(_wheel(r, path) for r, path in found if path is not None)

    @property
    def digest(self) -> str:
        # env reaches workers when they start; it shapes the environment only through the
        # setup commands, which see it.
        env = set() if self.image.setup else {"env"}
        image = self.image.model_dump(mode="json", exclude=_NOT_IN_ENVIRONMENT | env)
        if wheels := self.wheels:
            # By content, not by where the file sits on the client: a rebuilt wheel under the
            # same name is another environment, the same wheel moved is the same one.
            by_content = {
                w.requirement: f"{requirement_name(w.requirement)} @ sha256:{w.sha256}"
                for w in wheels
            }
            image["pip"] = [by_content.get(r, r) for r in self.image.pip]
        fields = {
            "image": image,
            "python_version": self.python_version,
            "python": self.python,
            "runtime": self.runtime,
            "script": _SCRIPT_VERSION,
        }
        blob = json.dumps(fields, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def env_dir(self) -> str:
        return f"{self.workdir}/envs/{self.digest}"


# Image fields that do not shape the environment the script makes: uploaded apart (includes),
# or only bounding the run (bootstrap_timeout).
_NOT_IN_ENVIRONMENT = {
    "includes",
    "excludes",
    "skyward_source",
    "bootstrap_timeout",
    "metrics",  # sampled by the worker, not installed
    # Where a managed CPython is downloaded from, not which: the version is in the digest.
    "python_mirror",
    "python_downloads_json_url",
    # Where the environment is kept once built, not what it is.
    "cache",
    "cache_endpoint",
}

# Bumped whenever the script's shape changes, so hosts do not trust environments that an
# older script made.
_SCRIPT_VERSION = 6


def render(plan: Plan) -> str:
    image = plan.image
    q = shlex.quote
    lines = [
        "#!/bin/sh",
        f"# Skyward bootstrap for image {plan.digest}; safe to run again.",
        "set -eu",
        # The script comes on stdin, and wheels make it long: whatever way it leaves (already
        # installed, an error), it reads the rest, or the client's write to a closed channel
        # would fail instead of reporting how the script ended.
        *(["trap 'cat >/dev/null' EXIT"] if plan.wheels else []),
        f"home={shell_path(plan.workdir)}",
        f'env_dir="$home/envs/{plan.digest}"',
        'mkdir -p "$home/envs"',
        'exec 9>"$env_dir.lock"',
        *_wait_for_lock(9, "$env_dir.lock"),
        'if [ -f "$env_dir/.skyward-ready" ]; then',
        f'  echo "skyward: image {plan.digest} is already installed"',
        "  exit 0",
        "fi",
        'step() { printf "%s%s\\n" "' + MARKER + '" "$*"; }',
        'enter() { printf "%s%s\\n" "' + STEP + '" "$1"; }',
        'cache_state() { printf "%s%s\\n" "' + CACHE + '" "$1"; }',
        'run() { step "$*"; "$@"; }',
    ]
    if image.apt:
        lines += apt_install(image.apt, "the image needs apt packages")
    version = plan.python_version
    major, minor = version.split(".")
    lines += [
        f"python={q(plan.python or '')}",
        'if [ -z "$python" ]; then',
        f"  for candidate in python{version} python3; do",
        '    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c '
        f"'import sys; sys.exit(sys.version_info[:2] != ({major}, {minor}))'"
        " 2>/dev/null; then",
        '      python="$(command -v "$candidate")"; break',
        "    fi",
        "  done",
        "fi",
    ]
    lines += _cache_fetch_lines(plan)
    lines += ["enter uv", *_uv_lines(plan)]
    lines += [*_git_check(plan), 'rm -rf "$env_dir"', "enter python", *_venv_lines(plan)]
    lines += [*_write_wheels(plan), "enter packages"]
    lines += [
        '"$uv" --version',
        'mkdir -p "$env_dir/skyward-requirements"',
        "cat > \"$env_dir/skyward-requirements/pyproject.toml\" <<'SKYWARD_EOF'",
        *_uv_project(plan),
        "SKYWARD_EOF",
        # uv reads [[tool.uv.index]] from the project in the working directory only.
        '(cd "$env_dir/skyward-requirements" &&'
        ' run "$uv" pip install -q --python "$env_dir/bin/python" -r pyproject.toml)',
    ]
    if image.setup:
        lines += [
            'PATH="$env_dir/bin:$PATH"; export PATH; VIRTUAL_ENV="$env_dir"; export VIRTUAL_ENV',
            *(f"export {k}={q(v)}" for k, v in sorted(image.env.items())),
        ]
        lines += ["enter setup", *(f"run sh -c {q(command)}" for command in image.setup)]
    lines += _cache_publish_lines(plan)
    lines += [
        f'echo {plan.digest} > "$env_dir/.skyward-ready"',
        f'echo "skyward: image {plan.digest} installed"',
        "",
    ]
    return "\n".join(lines)


# A line the script prints to say why it stops; the client puts the last one in the error's
# first line (``hosts.bootstrap``).
ERROR = "skyward: error: "

# Where the uv wheel comes from when the image names no index.
DEFAULT_INDEX = "https://pypi.org/simple/"

# The oldest uv the script uses: `uv venv --managed-python` and uv reading
# UV_PYTHON_DOWNLOADS_JSON_URL came in the 0.7 series; scoped indexes ([[tool.uv.index]],
# explicit) in 0.4.23. A host's older uv is passed over, and the newest on the index taken.
UV_MINIMUM = "0.8.0"

# apt-get waits for dpkg's lock itself (DPkg::Lock::Timeout), but `apt-get update` gives up at
# once on the lists' lock, which the first boot's unattended-upgrades holds for minutes: both
# are tried again, for a bounded time, while apt says another process holds a lock.
_APT_GET = r"""
apt_get() {
  apt_tries=0
  while :; do
    step "apt-get $*"
    { $sudo env DEBIAN_FRONTEND=noninteractive LC_ALL=C \
        apt-get -o DPkg::Lock::Timeout=300 "$@" 2>&1 &&
      echo 0 >"$env_dir.apt-status" || echo $? >"$env_dir.apt-status"; } | tee "$env_dir.apt-log"
    apt_status=$(cat "$env_dir.apt-status")
    [ "$apt_status" = 0 ] && return 0
    if grep -q 'Could not get lock' "$env_dir.apt-log" && [ "$apt_tries" -lt 60 ]; then
      apt_tries=$((apt_tries + 1))
      echo "skyward: another apt (the first boot's upgrades?) holds its lock; trying again in 5 s"
      sleep 5
    else
      return "$apt_status"
    fi
  done
}
"""


def apt_install(packages: tuple[str, ...] | list[str], why: str) -> list[str]:
    """Lines that install ``packages`` with apt-get, as root or through password-less sudo
    (``why`` says what needs them when the user has neither); ``$env_dir`` names where the
    retries keep apt's status. Used by the bootstrap and by the volumes' preparation."""
    listed = " ".join(shlex.quote(p) for p in packages)
    return [
        'if [ "$(id -u)" = 0 ]; then sudo=""',
        'elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"',
        "else",
        f'  echo "{ERROR}{why}, but this user is not root and has no password-less sudo" >&2',
        "  exit 126",
        "fi",
        *_APT_GET.strip("\n").split("\n"),
        "apt_get update -q",
        f"apt_get install -y -q --no-install-recommends {listed}",
    ]


# Fetching and unpacking uv's wheel with what a stock image has: curl, wget or any python3 to
# download; unzip, any python3, or (neither) od, tail, head and gzip to take the binary out
# of the wheel. Retries and timeouts are bounded; every failure says what to set.
_INSTALL_UV = r"""
at_least() {
  [ -n "$1" ] &&
    [ "$(printf '%s\n%s\n' "$1" "$2" | sort -t. -k1,1n -k2,2n -k3,3n | head -n 1)" = "$2" ]
}
usable_uv() {
  [ -x "$1" ] && at_least "$("$1" --version 2>/dev/null | cut -d' ' -f2)" UV_MINIMUM
}
fetch() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsSL --retry 3 --retry-delay 2 --retry-connrefused --connect-timeout 10 \
      --speed-limit 1024 --speed-time 30 -o "$2" "$1"
  elif command -v wget >/dev/null 2>&1; then
    wget -q --tries=4 --waitretry=2 --retry-connrefused --timeout=30 -O "$2" "$1"
  elif command -v python3 >/dev/null 2>&1; then
    python3 -c 'PYTHON_FETCH' "$1" "$2"
  else
    echo "ERROR_PREFIXthis host has no curl, wget or python3 to download uv with: add one" \
      "to the image (apt=[\"curl\"]) or install uv UV_MINIMUM or newer on its PATH" >&2
    return 127
  fi
}
zip_u() { od -An -tu"$3" -j "$2" -N "$3" "$1" | tr -d ' \n'; }
le32() {
  printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $(($1 & 255)) $(($1 >> 8 & 255)) \
    $(($1 >> 16 & 255)) $(($1 >> 24 & 255)))"
}
zip_member() {
  z_end=$(($(wc -c <"$1") - 22))
  [ "$(zip_u "$1" "$z_end" 4)" = 101010256 ] || return 1
  z_count=$(zip_u "$1" $((z_end + 10)) 2)
  z_at=$(zip_u "$1" $((z_end + 16)) 4)
  while [ "$z_count" -gt 0 ]; do
    [ "$(zip_u "$1" "$z_at" 4)" = 33639248 ] || return 1
    z_name=$(zip_u "$1" $((z_at + 28)) 2)
    if [ "$(tail -c +$((z_at + 47)) "$1" | head -c "$z_name")" = "$2" ]; then
      z_crc=$(zip_u "$1" $((z_at + 16)) 4)
      z_packed=$(zip_u "$1" $((z_at + 20)) 4)
      z_size=$(zip_u "$1" $((z_at + 24)) 4)
      z_head=$(zip_u "$1" $((z_at + 42)) 4)
      z_data=$((z_head + 31 + $(zip_u "$1" $((z_head + 26)) 2) + $(zip_u "$1" $((z_head + 28)) 2)))
      case $(zip_u "$1" $((z_at + 10)) 2) in
        0) tail -c +"$z_data" "$1" | head -c "$z_packed" ;;
        8) { printf '\037\213\010\000\000\000\000\000\000\377'
             tail -c +"$z_data" "$1" | head -c "$z_packed"
             le32 "$z_crc"; le32 "$z_size"; } | gzip -dc ;;
        *) return 1 ;;
      esac
      return
    fi
    z_at=$((z_at + 46 + z_name + $(zip_u "$1" $((z_at + 30)) 2) + $(zip_u "$1" $((z_at + 32)) 2)))
    z_count=$((z_count - 1))
  done
  return 1
}
install_uv() {
  u_page=$1; u_dir=$2/download.$$
  u_hint="set Image(index_url=...) to an index this host can reach that has uv's wheel, or"
  u_hint="$u_hint install uv UV_MINIMUM or newer on the host's PATH"
  rm -rf "$u_dir"; mkdir -p "$u_dir" "$2/bin"
  if ! fetch "$u_page" "$u_dir/page.html"; then
    echo "ERROR_PREFIXcannot read $u_page, the package index uv comes from: $u_hint" >&2
    rm -rf "$u_dir"; return 69
  fi
  case $(ldd --version 2>&1 || true) in *musl*) u_libc=musllinux ;; *) u_libc=manylinux ;; esac
  u_arch=$(uname -m)
  tr '<' '\n' <"$u_dir/page.html" | grep -v data-yanked |
    sed -n 's/^[aA][[:space:]].*[hH][rR][eE][fF]="\([^"]*\)".*/\1/p' >"$u_dir/links"
  while read -r u_href; do
    u_name=${u_href%%#*}; u_name=${u_name##*/}
    case $u_name in uv-*-py3-none-*"$u_libc"*_"$u_arch".whl) ;; *) continue ;; esac
    u_version=${u_name#uv-}; u_version=${u_version%%-*}
    case $u_version in ""|*[!0-9.]*) continue ;; esac
    printf '%s %s\n' "$u_version" "$u_href"
  done <"$u_dir/links" | sort -t. -k1,1n -k2,2n -k3,3n >"$u_dir/wheels"
  u_best=$(tail -n 1 "$u_dir/wheels"); u_url=${u_best#* }; u_best=${u_best%% *}
  if ! at_least "$u_best" UV_MINIMUM; then
    echo "ERROR_PREFIX$u_page lists no uv wheel UV_MINIMUM or newer for $u_libc $u_arch:" \
      "$u_hint" >&2
    rm -rf "$u_dir"; return 69
  fi
  case $u_url in
    http://*|https://*|file://*) ;;
    //*) u_url="${u_page%%//*}$u_url" ;;
    /*) u_url="$(printf '%s' "$u_page" | sed 's#^\([A-Za-z]*://[^/]*\).*#\1#')$u_url" ;;
    *) u_url="$u_page$u_url" ;;
  esac
  u_sha=""
  case $u_url in *"#sha256="*) u_sha=${u_url##*#sha256=} ;; esac
  u_url=${u_url%%#*}
  echo "skyward: downloading uv $u_best from $u_url"
  if ! fetch "$u_url" "$u_dir/uv.whl"; then
    echo "ERROR_PREFIXcannot download $u_url: $u_hint" >&2
    rm -rf "$u_dir"; return 69
  fi
  if [ -n "$u_sha" ] && command -v sha256sum >/dev/null 2>&1 &&
      [ "$(sha256sum "$u_dir/uv.whl" | cut -d' ' -f1)" != "$u_sha" ]; then
    echo "ERROR_PREFIX$u_url does not have the sha256 $u_page gives for it" >&2
    rm -rf "$u_dir"; return 69
  fi
  u_member="uv-$u_best.data/scripts/uv"
  if command -v unzip >/dev/null 2>&1; then
    unzip -p "$u_dir/uv.whl" "$u_member" >"$u_dir/uv"
  elif command -v python3 >/dev/null 2>&1; then
    python3 -c 'PYTHON_UNZIP' "$u_dir/uv.whl" "$u_member" >"$u_dir/uv"
  else
    zip_member "$u_dir/uv.whl" "$u_member" >"$u_dir/uv"
  fi && chmod 755 "$u_dir/uv" && "$u_dir/uv" --version >/dev/null || {
    echo "ERROR_PREFIXcannot unpack $u_member from $u_url on this host" >&2
    rm -rf "$u_dir"; return 69
  }
  mv -f "$u_dir/uv" "$2/bin/uv"
  rm -rf "$u_dir"
}
"""

# For any python3 a host has (no walrus, no f-strings), inside the script's single quotes
# (so no single quote in them).
_PYTHON_FETCH = (
    "import sys, time, urllib.request\n"
    "for attempt in range(4):\n"
    "    try:\n"
    "        with urllib.request.urlopen(sys.argv[1], timeout=30) as answer:\n"
    '            with open(sys.argv[2], "wb") as out:\n'
    '                for chunk in iter(lambda: answer.read(1 << 20), b""):\n'
    "                    out.write(chunk)\n"
    "        break\n"
    "    except Exception as error:\n"
    "        if attempt == 3:\n"
    '            sys.exit("%s: %s" % (sys.argv[1], error))\n'
    "        time.sleep(2)"
)
_PYTHON_UNZIP = (
    "import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))"
)


def _install_uv_functions() -> list[str]:
    text = (
        _INSTALL_UV.strip("\n")
        .replace("UV_MINIMUM", UV_MINIMUM)
        .replace("ERROR_PREFIX", ERROR)
        .replace("PYTHON_FETCH", _PYTHON_FETCH)
        .replace("PYTHON_UNZIP", _PYTHON_UNZIP)
    )
    return text.split("\n")


def _uv_lines(plan: Plan) -> list[str]:
    """Find uv (the host's, if new enough; the one installed before) or install it."""
    index = (plan.image.index_url or DEFAULT_INDEX).rstrip("/") + "/"
    page = shlex.quote(f"{index}uv/")
    return [
        *_install_uv_functions(),
        'uv="$(command -v uv || true)"',
        'if [ -n "$uv" ] && ! usable_uv "$uv"; then',
        f'  echo "skyward: not using $uv: older than {UV_MINIMUM}"; uv=""',
        "fi",
        'if [ -z "$uv" ]; then',
        '  exec 8>"$home/tools.lock"',
        *("  " + line for line in _wait_for_lock(8, "$home/tools.lock")),
        '  if usable_uv "$home/tools/bin/uv"; then uv="$home/tools/bin/uv"',
        "  else",
        f"    uv_page={page}",
        '    step "install uv into $home/tools/bin from $uv_page"',
        '    install_uv "$uv_page" "$home/tools"',
        '    uv="$home/tools/bin/uv"',
        "  fi",
        "  exec 8>&-",
        "fi",
    ]


def _venv_lines(plan: Plan) -> list[str]:
    """The environment, from the host's Python of the client's version if it has one, else
    from a uv-managed CPython of that version (kept under the workdir, shared by images)."""
    q = shlex.quote
    version, image = plan.python_version, plan.image
    where = image.python_mirror or "GitHub (python-build-standalone releases, the uv default)"
    settings = [
        'UV_PYTHON_INSTALL_DIR="$home/pythons"',
        "UV_PYTHON_DOWNLOADS=automatic",
        # A silent mirror costs 30 s a try; uv's defaults would take minutes to give up.
        "UV_HTTP_TIMEOUT=30",
        "UV_HTTP_RETRIES=2",
    ]
    if image.python_mirror is not None:
        settings.append(f"UV_PYTHON_INSTALL_MIRROR={q(image.python_mirror)}")
    if image.python_downloads_json_url is not None:
        settings.append(f"UV_PYTHON_DOWNLOADS_JSON_URL={q(image.python_downloads_json_url)}")
    hint = (
        "set Image(python_mirror=...) to a mirror of python-build-standalone this host can"
        " reach (and python_downloads_json_url=... for builds of your own)"
    )
    return [
        # --no-project: a pyproject.toml in the login directory must not change the Python.
        'if [ -n "$python" ]; then',
        '  run "$uv" venv -q --no-project --relocatable --python "$python" "$env_dir"',
        "else",
        f"  python_source={q(where)}",
        f'  echo "skyward: no Python {version} on this host (the client runs {version}, and'
        f" cloudpickle needs the same minor version on both ends): using a uv-managed"
        f' CPython {version} from $python_source"',
        f'  step "$uv" venv --no-project --relocatable --managed-python --python {version}'
        ' "$env_dir"',
        f"  env {' '.join(settings)} \\",
        f'    "$uv" venv -q --no-project --relocatable --managed-python --python {version}'
        ' "$env_dir" ||',
        f'    {{ status=$?; echo "{ERROR}uv could not install CPython {version} from'
        f" $python_source: {hint}, or install Python {version} on the host (the reason uv"
        ' gave is above)" >&2; exit $status; }',
        "fi",
    ]


# What ``::skyward-step::`` names: the script's share of the bootstrap's steps.
STEPS = tuple(step for step in BOOTSTRAP_STEPS if step not in ("skyward", "wait"))


def _store_source() -> str:
    """The environment cache's store client, carried to the node as text (stdlib only)."""
    return (Path(__file__).parents[1] / "envcache" / "store.py").read_text()


def _cache_fetch_lines(plan: Plan) -> list[str]:
    """With ``Image.cache``: look for this environment in the cache and, when it is whole,
    unpack it and stop here. On a miss, a node told to wait (``SKYWARD_CACHE_ROLE=wait``)
    says so and stops; any other node checks that it can write the cache, and builds."""
    image = plan.image
    if image.cache is None:
        return []
    q = shlex.quote
    source = _store_source()
    name = f"envcache-{hashlib.sha256(source.encode()).hexdigest()[:12]}.py"
    return [
        'cache_py="$python"',
        'if [ -z "$cache_py" ]; then cache_py="$(command -v python3 || true)"; fi',
        'mkdir -p "$home/tools"',
        'home_abs="$(cd "$home" && pwd)"',
        f'cache_client="$home/tools/{name}"',
        'if [ ! -f "$cache_client" ]; then',
        "  cat > \"$cache_client.$$\" <<'SKYWARD_STORE_EOF'",
        source.rstrip("\n"),
        "SKYWARD_STORE_EOF",
        '  mv -f "$cache_client.$$" "$cache_client"',
        "fi",
        "cache() {",
        f'  "$cache_py" "$cache_client" "$1" --url {q(image.cache)}'
        f" --endpoint {q(image.cache_endpoint or '')} --digest {plan.digest}"
        f' --python "$python" --version {plan.python_version} --home "$home_abs"'
        ' --env-dir "$home_abs/envs/' + plan.digest + '" --tags "${SKYWARD_CACHE_TAGS:-}"',
        "}",
        "cache_write=no",
        'if [ -z "$cache_py" ]; then',
        '  echo "skyward: cache: this host has no python3 to read the cache with; building"',
        "  cache_state off",
        "else",
        "  enter cache",
        "  cache_status=0; cache fetch || cache_status=$?",
        '  if [ "$cache_status" = 0 ]; then',
        "    cache_state hit",
        f'    echo {plan.digest} > "$env_dir/.skyward-ready"',
        f'    echo "skyward: image {plan.digest} installed from the cache"',
        "    exit 0",
        '  elif [ "$cache_status" = 10 ] && [ "${SKYWARD_CACHE_ROLE:-build}" = wait ]; then',
        '    echo "skyward: cache: waiting for the node that builds this environment"',
        "    cache_state wait",
        "    exit 0",
        '  elif [ "$cache_status" = 10 ] && cache probe; then',
        '    echo "skyward: cache: building this environment, then uploading it"',
        "    cache_state building; cache_write=yes",
        '  elif [ "$cache_status" = 10 ]; then',
        '    echo "skyward: cache: building this environment (the cache cannot be written)"',
        "    cache_state unwritable",
        "  else",
        "    cache_state off",
        "  fi",
        "fi",
    ]


def _cache_publish_lines(plan: Plan) -> list[str]:
    """Upload the environment just built, when this node checked it may."""
    if plan.image.cache is None:
        return []
    return [
        'if [ "$cache_write" = yes ]; then',
        "  enter publish",
        "  if cache publish; then cache_state published; else cache_state unpublished; fi",
        "fi",
    ]


# How long a bootstrap waits for another one of the same image (or the uv install) on the
# same host before giving up with a message, rather than hanging without one.
_LOCK_WAIT = 900


def _wait_for_lock(fd: int, path: str) -> list[str]:
    return [
        f"if command -v flock >/dev/null 2>&1 && ! flock -n {fd}; then",
        f'  echo "skyward: another bootstrap on this host holds {path}; waiting for it"',
        f'  flock -w {_LOCK_WAIT} {fd} || {{ echo "skyward: {path} still held after'
        f' {_LOCK_WAIT} s; is a bootstrap stuck on this host (ps -u \\$(id -un))?" >&2;'
        " exit 75; }",
        "fi",
    ]


def _direct_reference(requirement: str) -> bool:
    """``name @ <url>``: installed from where it points, never from an index."""
    from packaging.requirements import Requirement

    return Requirement(requirement).url is not None


def _git_check(plan: Plan) -> list[str]:
    from packaging.requirements import Requirement

    names = [
        requirement_name(r) for r in plan.installs if (Requirement(r).url or "").startswith("git+")
    ]
    if not names:
        return []
    # pip and uv both run the git command to fetch; say so rather than let them fail.
    return [
        "if ! command -v git >/dev/null 2>&1; then",
        f'  echo "skyward: the image installs {", ".join(names)} from git, and this host has'
        ' no git: add it to the image (apt=[\\"git\\"]) or install it" >&2',
        "  exit 127",
        "fi",
    ]


# Decodes one wheel from the script into its place; a rename, so that two bootstraps that
# carry the same wheel (two images) never see a half-written file.
_UNPACK_WHEEL = (
    "import base64, os, sys; path = sys.argv[1]; part = path + str(os.getpid()); "
    'open(part, "wb").write(base64.b64decode(sys.stdin.buffer.read())); '
    "os.replace(part, path)"
)


def _write_wheels(plan: Plan) -> list[str]:
    lines: list[str] = []
    for wheel in plan.wheels:
        target = f'"$home"/{wheel.host_dir}/{shlex.quote(wheel.filename)}'
        lines += [
            f"if [ ! -f {target} ]; then",
            f'  mkdir -p "$home"/{wheel.host_dir}',
            f"  step {shlex.quote(f'write {wheel.filename} ({len(wheel.data) // 1024} KiB)')}",
            f"  \"$env_dir/bin/python\" -c {shlex.quote(_UNPACK_WHEEL)} {target} <<'SKYWARD_WHEEL'",
            base64.encodebytes(wheel.data).decode().rstrip("\n"),
            "SKYWARD_WHEEL",
            "fi",
        ]
    return lines


def _without_url(requirement: str) -> str:
    """``name[extras] @ url; marker`` as ``name[extras]; marker``."""
    from packaging.requirements import Requirement

    parsed = Requirement(requirement)
    parsed.url = None
    return str(parsed)


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _uv_project(plan: Plan) -> list[str]:
    """A pyproject.toml that pins each scoped package to its index (``explicit``)."""
    image = plan.image
    wheels = {wheel.requirement: wheel for wheel in plan.wheels}
    dependencies = [_without_url(r) if r in wheels else r for r in plan.installs]
    lines = [
        "[project]",
        'name = "skyward-image"',
        'version = "0"',
        "dependencies = [" + ", ".join(_toml(r) for r in dependencies) + "]",
    ]
    # A package given by URL or wheel comes from there; an index source for it as well
    # would be a second, conflicting source.
    direct = {requirement_name(r) for r in plan.installs if _direct_reference(r)}
    sources: list[str] = []
    for number, index in enumerate(image.pip_indexes):
        name = f"skyward-{number}"
        lines += ["[[tool.uv.index]]", f'name = "{name}"', f"url = {_toml(index.url)}"]
        lines.append("explicit = true")
        if index.find_links:
            lines.append('format = "flat"')
        sources += [
            f'{package} = {{ index = "{name}" }}'
            for package in index.packages
            if package not in direct
        ]
    # Relative to the project, <env>/skyward-requirements: the host's $HOME is not known here.
    sources += [
        f"{requirement_name(r)} = {{ path = {_toml(f'../../../{w.host_dir}/{w.filename}')} }}"
        for r, w in wheels.items()
    ]
    if image.index_url is not None:
        lines += [
            "[[tool.uv.index]]",
            'name = "skyward-default"',
            f"url = {_toml(image.index_url)}",
            "default = true",
        ]
    if sources:
        lines += ["[tool.uv.sources]", *sources]
    return lines

"""The bootstrap script: a POSIX shell script, rendered from an ``Image``, that prepares a host.

``render`` is a pure function of its inputs (snapshot-tested). The script:

1. takes a lock, and leaves at once if this image's environment is already complete
   (``<workdir>/envs/<hash>/.skyward-ready``): a second pool with the same image on the
   same host installs nothing;
2. installs apt packages when it runs as root or has password-less sudo;
3. finds a Python of the client's minor version (or the one ``SSH(python=...)`` names),
   and uv (on PATH, or installed once into ``<workdir>/tools`` from the package index;
   ``python -m venv`` + pip when neither works);
4. writes the image's local wheel files, which travel inside the script, into
   ``<workdir>/wheels/<sha256>/``, and checks that ``git`` exists if a requirement comes
   from git;
5. makes a virtual environment and installs the requirements: ``index_url`` (if set)
   replaces the default index everywhere, and each ``PipIndex`` serves only the packages it
   names, and those are installed (uv pins them to it; pip installs them from it first,
   without dependencies). Direct references (``name @ git+https://...``, wheels) come from
   where they point, whatever index scoping says;
6. runs the ``setup`` commands with the image's ``env`` and the environment on ``PATH``;
7. marks the environment complete.

Before each command it prints ``::skyward:: <command>``, so the client can name the command
that failed; everything else it prints is the commands' own output.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from skyward._image import Image, local_wheel, requirement_name

MARKER = "::skyward:: "


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
_NOT_IN_ENVIRONMENT = {"includes", "excludes", "skyward_source", "bootstrap_timeout"}

# Bumped whenever the script's shape changes, so hosts do not trust environments that an
# older script made.
_SCRIPT_VERSION = 4


def shell_path(path: str) -> str:
    """``path`` for a POSIX shell: ``~/x`` becomes ``"$HOME"/x``, the rest quoted."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


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
        'run() { step "$*"; "$@"; }',
    ]
    if image.apt:
        packages = " ".join(q(p) for p in image.apt)
        lines += [
            'if [ "$(id -u)" = 0 ]; then sudo=""',
            'elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"',
            "else",
            '  echo "skyward: the image needs apt packages, but this user is not root and has'
            ' no password-less sudo" >&2',
            "  exit 126",
            "fi",
            "run $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q",
            "run $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
            f"--no-install-recommends {packages}",
        ]
    version = plan.python_version
    major, minor = version.split(".")
    lines += [
        f"python={q(plan.python or '')}",
        'if [ -z "$python" ]; then',
        f"  for candidate in python{version} python3; do",
        '    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c '
        f"'import sys; sys.exit(sys.version_info[:2] != ({major}, {minor}))'; then",
        '      python="$(command -v "$candidate")"; break',
        "    fi",
        "  done",
        "fi",
        'if [ -z "$python" ]; then',
        f'  echo "skyward: no Python {version} on this host (the client runs {version}, and'
        " cloudpickle needs the same minor version on both ends). Install it, or name it"
        ' with python=..." >&2',
        "  exit 127",
        "fi",
    ]
    default_index = image.index_url
    pip_index = _pip_index_options(default_index)
    lines += [
        'uv="$(command -v uv || true)"',
        # Scoped indexes ([[tool.uv.index]], explicit) need uv 0.4.23 or newer.
        'if [ -n "$uv" ] && ! "$python" -c \'import sys; sys.exit(tuple(map(int,'
        ' sys.argv[1].split(".")[:3])) < (0, 4, 23))\' "$("$uv" --version | cut -d" " -f2)"'
        " 2>/dev/null; then",
        '  echo "skyward: not using $uv: older than 0.4.23, which scoped indexes need"; uv=""',
        "fi",
        'if [ -z "$uv" ] && [ -x "$home/tools/bin/uv" ]; then uv="$home/tools/bin/uv"; fi',
        'if [ -z "$uv" ]; then',
        '  exec 8>"$home/tools.lock"',
        *("  " + line for line in _wait_for_lock(8, "$home/tools.lock")),
        '  if [ -x "$home/tools/bin/uv" ]; then uv="$home/tools/bin/uv"',
        '  elif step "install uv into $home/tools" && rm -rf "$home/tools" &&'
        ' "$python" -m venv "$home/tools" &&'
        f' "$home/tools/bin/pip" install -q --disable-pip-version-check{pip_index} uv; then',
        '    uv="$home/tools/bin/uv"',
        "  else",
        '    echo "skyward: uv could not be installed; using python -m venv and pip"',
        "  fi",
        "  exec 8>&-",
        "fi",
        *_git_check(plan),
        *_write_wheels(plan),
        'rm -rf "$env_dir"',
    ]
    wheels = {wheel.requirement: wheel for wheel in plan.wheels}
    requirements = " ".join(
        _pip_wheel_argument(wheels[r]) if r in wheels else q(r) for r in plan.installs
    )
    lines += [
        'if [ -n "$uv" ]; then',
        '  run "$uv" venv -q --python "$python" "$env_dir"',
        '  mkdir -p "$env_dir/skyward-requirements"',
        "  cat > \"$env_dir/skyward-requirements/pyproject.toml\" <<'SKYWARD_EOF'",
        *_uv_project(plan),
        "SKYWARD_EOF",
        # uv reads [[tool.uv.index]] from the project in the working directory only.
        '  (cd "$env_dir/skyward-requirements" &&'
        ' run "$uv" pip install -q --python "$env_dir/bin/python" -r pyproject.toml)',
        "else",
        '  run "$python" -m venv "$env_dir"',
    ]
    pip = '"$env_dir/bin/pip" install -q --disable-pip-version-check'
    for index in image.pip_indexes:
        scoped = [
            r
            for r in plan.installs
            if requirement_name(r) in index.packages and not _direct_reference(r)
        ]
        if not scoped:
            continue
        # pip cannot pin a package to an index, and with two indexes it takes the highest
        # version from either. So the named packages come first, from their index alone and
        # without dependencies; the install below finds them satisfied and brings the rest.
        if index.find_links:
            only = f" --no-index --find-links {q(index.url)}"
        else:
            only = f" --index-url {q(index.url)}"
        only += _trusted_host(index.url)
        lines.append(f"  run {pip} --no-deps{only} {' '.join(q(r) for r in scoped)}")
    lines += [f"  run {pip}{pip_index} {requirements}", "fi"]
    if image.setup:
        lines += [
            'PATH="$env_dir/bin:$PATH"; export PATH; VIRTUAL_ENV="$env_dir"; export VIRTUAL_ENV',
            *(f"export {k}={q(v)}" for k, v in sorted(image.env.items())),
        ]
        lines += [f"run sh -c {q(command)}" for command in image.setup]
    lines += [
        f'echo {plan.digest} > "$env_dir/.skyward-ready"',
        f'echo "skyward: image {plan.digest} installed"',
        "",
    ]
    return "\n".join(lines)


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


def _pip_index_options(url: str | None) -> str:
    if url is None:
        return ""
    return f" --index-url {shlex.quote(url)}{_trusted_host(url)}"


def _trusted_host(url: str) -> str:
    # pip refuses plain-http indexes unless told to trust the host; naming an http index in
    # the image is that decision (uv needs no such flag).
    parts = urlsplit(url)
    if parts.scheme == "http" and parts.hostname:
        return f" --trusted-host {shlex.quote(parts.hostname)}"
    return ""


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
            f"  \"$python\" -c {shlex.quote(_UNPACK_WHEEL)} {target} <<'SKYWARD_WHEEL'",
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


def _pip_wheel_argument(wheel: Wheel) -> str:
    """The requirement for pip, pointing at the wheel's place on the host."""
    from packaging.requirements import Requirement

    parsed = Requirement(wheel.requirement)
    extras = f"[{','.join(sorted(parsed.extras))}]" if parsed.extras else ""
    marker = f"; {parsed.marker}" if parsed.marker else ""
    head = shlex.quote(f"{parsed.name}{extras} @ file://")
    tail = shlex.quote(f"/{wheel.host_dir}/{wheel.filename}{marker}")
    return f'{head}"$home"{tail}'


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

"""The bootstrap script: a POSIX shell script, rendered from an ``Image``, that prepares a host.

``render`` is a pure function of its inputs (snapshot-tested). The script:

1. takes a lock, and leaves at once if this image's environment is already complete
   (``<workdir>/envs/<hash>/.skyward-ready``): a second pool with the same image on the
   same host installs nothing;
2. installs apt packages when it runs as root or has password-less sudo;
3. finds a Python of the client's minor version (or the one ``SSH(python=...)`` names),
   and uv (on PATH, or installed once into ``<workdir>/tools`` from the package index;
   ``python -m venv`` + pip when neither works);
4. makes a virtual environment and installs the requirements: ``index_url`` (if set)
   replaces the default index everywhere, and each ``PipIndex`` serves only the packages it
   names, and those are installed (uv pins them to it; pip installs them from it first,
   without dependencies);
5. runs the ``setup`` commands with the image's ``env`` and the environment on ``PATH``;
6. marks the environment complete.

Before each command it prints ``::skyward:: <command>``, so the client can name the command
that failed; everything else it prints is the commands' own output.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from urllib.parse import urlsplit

from skyward._image import Image, requirement_name

MARKER = "::skyward:: "


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
    def digest(self) -> str:
        env = set() if self.image.setup else {"env"}
        fields = {
            # env reaches workers when they start; it shapes the environment only through
            # the setup commands, which see it.
            "image": self.image.model_dump(mode="json", exclude=_NOT_IN_ENVIRONMENT | env),
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
        'rm -rf "$env_dir"',
    ]
    requirements = " ".join(q(r) for r in plan.installs)
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
        scoped = [r for r in plan.installs if requirement_name(r) in index.packages]
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


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _uv_project(plan: Plan) -> list[str]:
    """A pyproject.toml that pins each scoped package to its index (``explicit``)."""
    image = plan.image
    lines = [
        "[project]",
        'name = "skyward-image"',
        'version = "0"',
        "dependencies = [" + ", ".join(_toml(r) for r in plan.installs) + "]",
    ]
    sources: list[str] = []
    for number, index in enumerate(image.pip_indexes):
        name = f"skyward-{number}"
        lines += ["[[tool.uv.index]]", f'name = "{name}"', f"url = {_toml(index.url)}"]
        lines.append("explicit = true")
        if index.find_links:
            lines.append('format = "flat"')
        sources += [f'{package} = {{ index = "{name}" }}' for package in index.packages]
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

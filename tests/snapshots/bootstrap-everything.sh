#!/bin/sh
# Skyward bootstrap for image 38ad3fb0e1c94d47; safe to run again.
set -eu
home=/srv/skyward
env_dir="$home/envs/38ad3fb0e1c94d47"
mkdir -p "$home/envs"
exec 9>"$env_dir.lock"
if command -v flock >/dev/null 2>&1 && ! flock -n 9; then
  echo "skyward: another bootstrap on this host holds $env_dir.lock; waiting for it"
  flock -w 900 9 || { echo "skyward: $env_dir.lock still held after 900 s; is a bootstrap stuck on this host (ps -u \$(id -un))?" >&2; exit 75; }
fi
if [ -f "$env_dir/.skyward-ready" ]; then
  echo "skyward: image 38ad3fb0e1c94d47 is already installed"
  exit 0
fi
step() { printf "%s%s\n" "::skyward:: " "$*"; }
run() { step "$*"; "$@"; }
if [ "$(id -u)" = 0 ]; then sudo=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"
else
  echo "skyward: the image needs apt packages, but this user is not root and has no password-less sudo" >&2
  exit 126
fi
run $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
run $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends libgl1 git
python=/opt/python/bin/python3.12
if [ -z "$python" ]; then
  for candidate in python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
      python="$(command -v "$candidate")"; break
    fi
  done
fi
if [ -z "$python" ]; then
  echo "skyward: no Python 3.12 on this host (the client runs 3.12, and cloudpickle needs the same minor version on both ends). Install it, or name it with python=..." >&2
  exit 127
fi
uv="$(command -v uv || true)"
if [ -n "$uv" ] && ! "$python" -c 'import sys; sys.exit(tuple(map(int, sys.argv[1].split(".")[:3])) < (0, 4, 23))' "$("$uv" --version | cut -d" " -f2)" 2>/dev/null; then
  echo "skyward: not using $uv: older than 0.4.23, which scoped indexes need"; uv=""
fi
if [ -z "$uv" ] && [ -x "$home/tools/bin/uv" ]; then uv="$home/tools/bin/uv"; fi
if [ -z "$uv" ]; then
  exec 8>"$home/tools.lock"
  if command -v flock >/dev/null 2>&1 && ! flock -n 8; then
    echo "skyward: another bootstrap on this host holds $home/tools.lock; waiting for it"
    flock -w 900 8 || { echo "skyward: $home/tools.lock still held after 900 s; is a bootstrap stuck on this host (ps -u \$(id -un))?" >&2; exit 75; }
  fi
  if [ -x "$home/tools/bin/uv" ]; then uv="$home/tools/bin/uv"
  elif step "install uv into $home/tools" && rm -rf "$home/tools" && "$python" -m venv "$home/tools" && "$home/tools/bin/pip" install -q --disable-pip-version-check --index-url https://pypi.mirror.example/simple/ uv; then
    uv="$home/tools/bin/uv"
  else
    echo "skyward: uv could not be installed; using python -m venv and pip"
  fi
  exec 8>&-
fi
rm -rf "$env_dir"
if [ -n "$uv" ]; then
  run "$uv" venv -q --python "$python" "$env_dir"
  mkdir -p "$env_dir/skyward-requirements"
  cat > "$env_dir/skyward-requirements/pyproject.toml" <<'SKYWARD_EOF'
[project]
name = "skyward-image"
version = "0"
dependencies = ["numpy>=2", "jax[cuda12]==0.6.2", "skytiny", "cloudpickle==3.1.1", "pydantic==2.11.7", "jax-cuda12-plugin"]
[[tool.uv.index]]
name = "skyward-0"
url = "https://mirror.example/jax/"
explicit = true
format = "flat"
[[tool.uv.index]]
name = "skyward-1"
url = "http://10.0.0.5:8700/simple/"
explicit = true
[[tool.uv.index]]
name = "skyward-default"
url = "https://pypi.mirror.example/simple/"
default = true
[tool.uv.sources]
jax-cuda12-plugin = { index = "skyward-0" }
skytiny = { index = "skyward-1" }
SKYWARD_EOF
  (cd "$env_dir/skyward-requirements" && run "$uv" pip install -q --python "$env_dir/bin/python" -r pyproject.toml)
else
  run "$python" -m venv "$env_dir"
  run "$env_dir/bin/pip" install -q --disable-pip-version-check --no-deps --no-index --find-links https://mirror.example/jax/ jax-cuda12-plugin
  run "$env_dir/bin/pip" install -q --disable-pip-version-check --no-deps --index-url http://10.0.0.5:8700/simple/ --trusted-host 10.0.0.5 skytiny
  run "$env_dir/bin/pip" install -q --disable-pip-version-check --index-url https://pypi.mirror.example/simple/ 'numpy>=2' 'jax[cuda12]==0.6.2' skytiny cloudpickle==3.1.1 pydantic==2.11.7 jax-cuda12-plugin
fi
PATH="$env_dir/bin:$PATH"; export PATH; VIRTUAL_ENV="$env_dir"; export VIRTUAL_ENV
export A='it'"'"'s'
export XLA_FLAGS=--xla_force_host_platform_device_count=2
run sh -c 'echo ready > /tmp/marker'
run sh -c 'git --version'
echo 38ad3fb0e1c94d47 > "$env_dir/.skyward-ready"
echo "skyward: image 38ad3fb0e1c94d47 installed"

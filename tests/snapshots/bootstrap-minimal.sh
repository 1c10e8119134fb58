#!/bin/sh
# Skyward bootstrap for image 4fb31243e9af91bf; safe to run again.
set -eu
home="$HOME"/.cache/skyward
env_dir="$home/envs/4fb31243e9af91bf"
mkdir -p "$home/envs"
exec 9>"$env_dir.lock"
if command -v flock >/dev/null 2>&1 && ! flock -n 9; then
  echo "skyward: another bootstrap on this host holds $env_dir.lock; waiting for it"
  flock -w 900 9 || { echo "skyward: $env_dir.lock still held after 900 s; is a bootstrap stuck on this host (ps -u \$(id -un))?" >&2; exit 75; }
fi
if [ -f "$env_dir/.skyward-ready" ]; then
  echo "skyward: image 4fb31243e9af91bf is already installed"
  exit 0
fi
step() { printf "%s%s\n" "::skyward:: " "$*"; }
run() { step "$*"; "$@"; }
python=''
if [ -z "$python" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      python="$(command -v "$candidate")"; break
    fi
  done
fi
if [ -z "$python" ]; then
  echo "skyward: no Python 3.11 on this host (the client runs 3.11, and cloudpickle needs the same minor version on both ends). Install it, or name it with python=..." >&2
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
  elif step "install uv into $home/tools" && rm -rf "$home/tools" && "$python" -m venv "$home/tools" && "$home/tools/bin/pip" install -q --disable-pip-version-check uv; then
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
dependencies = ["cloudpickle==3.1.1", "pydantic==2.11.7"]
SKYWARD_EOF
  (cd "$env_dir/skyward-requirements" && run "$uv" pip install -q --python "$env_dir/bin/python" -r pyproject.toml)
else
  run "$python" -m venv "$env_dir"
  run "$env_dir/bin/pip" install -q --disable-pip-version-check cloudpickle==3.1.1 pydantic==2.11.7
fi
echo 4fb31243e9af91bf > "$env_dir/.skyward-ready"
echo "skyward: image 4fb31243e9af91bf installed"

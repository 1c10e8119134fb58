#!/bin/sh
# Skyward bootstrap for image ac792159435bec68; safe to run again.
set -eu
trap 'cat >/dev/null' EXIT
home="$HOME"/.cache/skyward
env_dir="$home/envs/ac792159435bec68"
mkdir -p "$home/envs"
exec 9>"$env_dir.lock"
if command -v flock >/dev/null 2>&1 && ! flock -n 9; then
  echo "skyward: another bootstrap on this host holds $env_dir.lock; waiting for it"
  flock -w 900 9 || { echo "skyward: $env_dir.lock still held after 900 s; is a bootstrap stuck on this host (ps -u \$(id -un))?" >&2; exit 75; }
fi
if [ -f "$env_dir/.skyward-ready" ]; then
  echo "skyward: image ac792159435bec68 is already installed"
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
if ! command -v git >/dev/null 2>&1; then
  echo "skyward: the image installs mpmd from git, and this host has no git: add it to the image (apt=[\"git\"]) or install it" >&2
  exit 127
fi
if [ ! -f "$home"/wheels/a8477c2b84196d26/jaxpp-0.1-py3-none-any.whl ]; then
  mkdir -p "$home"/wheels/a8477c2b84196d26
  step 'write jaxpp-0.1-py3-none-any.whl (0 KiB)'
  "$python" -c 'import base64, os, sys; path = sys.argv[1]; part = path + str(os.getpid()); open(part, "wb").write(base64.b64decode(sys.stdin.buffer.read())); os.replace(part, path)' "$home"/wheels/a8477c2b84196d26/jaxpp-0.1-py3-none-any.whl <<'SKYWARD_WHEEL'
UEsDBBQAAAAAAAAAIQC9UHsjEAAAABAAAAAIAAAAamF4cHAucHlWRVJTSU9OID0gJzAuMScKUEsD
BBQAAAAAAAAAIQAdF7T1LwAAAC8AAAAcAAAAamF4cHAtMC4xLmRpc3QtaW5mby9NRVRBREFUQU1l
dGFkYXRhLVZlcnNpb246IDIuMQpOYW1lOiBqYXhwcApWZXJzaW9uOiAwLjEKUEsBAhQDFAAAAAAA
AAAhAL1QeyMQAAAAEAAAAAgAAAAAAAAAAAAAAIABAAAAAGpheHBwLnB5UEsBAhQDFAAAAAAAAAAh
AB0XtPUvAAAALwAAABwAAAAAAAAAAAAAAIABNgAAAGpheHBwLTAuMS5kaXN0LWluZm8vTUVUQURB
VEFQSwUGAAAAAAIAAgCAAAAAnwAAAAAA
SKYWARD_WHEEL
fi
rm -rf "$env_dir"
if [ -n "$uv" ]; then
  run "$uv" venv -q --python "$python" "$env_dir"
  mkdir -p "$env_dir/skyward-requirements"
  cat > "$env_dir/skyward-requirements/pyproject.toml" <<'SKYWARD_EOF'
[project]
name = "skyward-image"
version = "0"
dependencies = ["mpmd @ git+https://github.example/mpmd/mpmd.git@0123abc", "jaxpp", "jax[cuda12]", "cloudpickle==3.1.1", "pydantic==2.11.7", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt"]
[[tool.uv.index]]
name = "skyward-0"
url = "https://storage.example/jax_cuda_releases.html"
explicit = true
format = "flat"
[tool.uv.sources]
jax = { index = "skyward-0" }
jaxlib = { index = "skyward-0" }
jax-cuda12-plugin = { index = "skyward-0" }
jax-cuda12-pjrt = { index = "skyward-0" }
jaxpp = { path = "../../../wheels/a8477c2b84196d26/jaxpp-0.1-py3-none-any.whl" }
SKYWARD_EOF
  (cd "$env_dir/skyward-requirements" && run "$uv" pip install -q --python "$env_dir/bin/python" -r pyproject.toml)
else
  run "$python" -m venv "$env_dir"
  run "$env_dir/bin/pip" install -q --disable-pip-version-check --no-deps --no-index --find-links https://storage.example/jax_cuda_releases.html 'jax[cuda12]' jaxlib jax-cuda12-plugin jax-cuda12-pjrt
  run "$env_dir/bin/pip" install -q --disable-pip-version-check 'mpmd @ git+https://github.example/mpmd/mpmd.git@0123abc' 'jaxpp @ file://'"$home"/wheels/a8477c2b84196d26/jaxpp-0.1-py3-none-any.whl 'jax[cuda12]' cloudpickle==3.1.1 pydantic==2.11.7 jaxlib jax-cuda12-plugin jax-cuda12-pjrt
fi
echo ac792159435bec68 > "$env_dir/.skyward-ready"
echo "skyward: image ac792159435bec68 installed"

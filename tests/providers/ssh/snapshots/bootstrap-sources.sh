#!/bin/sh
# Skyward bootstrap for image 69b7f04aab986746; safe to run again.
set -eu
trap 'cat >/dev/null' EXIT
home="$HOME"/.cache/skyward
env_dir="$home/envs/69b7f04aab986746"
mkdir -p "$home/envs"
exec 9>"$env_dir.lock"
if command -v flock >/dev/null 2>&1 && ! flock -n 9; then
  echo "skyward: another bootstrap on this host holds $env_dir.lock; waiting for it"
  flock -w 900 9 || { echo "skyward: $env_dir.lock still held after 900 s; is a bootstrap stuck on this host (ps -u \$(id -un))?" >&2; exit 75; }
fi
if [ -f "$env_dir/.skyward-ready" ]; then
  echo "skyward: image 69b7f04aab986746 is already installed"
  exit 0
fi
step() { printf "%s%s\n" "::skyward:: " "$*"; }
run() { step "$*"; "$@"; }
python=''
if [ -z "$python" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      python="$(command -v "$candidate")"; break
    fi
  done
fi
at_least() {
  [ -n "$1" ] &&
    [ "$(printf '%s\n%s\n' "$1" "$2" | sort -t. -k1,1n -k2,2n -k3,3n | head -n 1)" = "$2" ]
}
usable_uv() {
  [ -x "$1" ] && at_least "$("$1" --version 2>/dev/null | cut -d' ' -f2)" 0.8.0
}
fetch() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsSL --retry 3 --retry-delay 2 --retry-connrefused --connect-timeout 10 \
      --speed-limit 1024 --speed-time 30 -o "$2" "$1"
  elif command -v wget >/dev/null 2>&1; then
    wget -q --tries=4 --waitretry=2 --retry-connrefused --timeout=30 -O "$2" "$1"
  elif command -v python3 >/dev/null 2>&1; then
    python3 -c 'import sys, time, urllib.request
for attempt in range(4):
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=30) as answer:
            with open(sys.argv[2], "wb") as out:
                for chunk in iter(lambda: answer.read(1 << 20), b""):
                    out.write(chunk)
        break
    except Exception as error:
        if attempt == 3:
            sys.exit("%s: %s" % (sys.argv[1], error))
        time.sleep(2)' "$1" "$2"
  else
    echo "skyward: error: this host has no curl, wget or python3 to download uv with: add one" \
      "to the image (apt=[\"curl\"]) or install uv 0.8.0 or newer on its PATH" >&2
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
  u_hint="$u_hint install uv 0.8.0 or newer on the host's PATH"
  rm -rf "$u_dir"; mkdir -p "$u_dir" "$2/bin"
  if ! fetch "$u_page" "$u_dir/page.html"; then
    echo "skyward: error: cannot read $u_page, the package index uv comes from: $u_hint" >&2
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
  if ! at_least "$u_best" 0.8.0; then
    echo "skyward: error: $u_page lists no uv wheel 0.8.0 or newer for $u_libc $u_arch:" \
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
    echo "skyward: error: cannot download $u_url: $u_hint" >&2
    rm -rf "$u_dir"; return 69
  fi
  if [ -n "$u_sha" ] && command -v sha256sum >/dev/null 2>&1 &&
      [ "$(sha256sum "$u_dir/uv.whl" | cut -d' ' -f1)" != "$u_sha" ]; then
    echo "skyward: error: $u_url does not have the sha256 $u_page gives for it" >&2
    rm -rf "$u_dir"; return 69
  fi
  u_member="uv-$u_best.data/scripts/uv"
  if command -v unzip >/dev/null 2>&1; then
    unzip -p "$u_dir/uv.whl" "$u_member" >"$u_dir/uv"
  elif command -v python3 >/dev/null 2>&1; then
    python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' "$u_dir/uv.whl" "$u_member" >"$u_dir/uv"
  else
    zip_member "$u_dir/uv.whl" "$u_member" >"$u_dir/uv"
  fi && chmod 755 "$u_dir/uv" && "$u_dir/uv" --version >/dev/null || {
    echo "skyward: error: cannot unpack $u_member from $u_url on this host" >&2
    rm -rf "$u_dir"; return 69
  }
  mv -f "$u_dir/uv" "$2/bin/uv"
  rm -rf "$u_dir"
}
uv="$(command -v uv || true)"
if [ -n "$uv" ] && ! usable_uv "$uv"; then
  echo "skyward: not using $uv: older than 0.8.0"; uv=""
fi
if [ -z "$uv" ]; then
  exec 8>"$home/tools.lock"
  if command -v flock >/dev/null 2>&1 && ! flock -n 8; then
    echo "skyward: another bootstrap on this host holds $home/tools.lock; waiting for it"
    flock -w 900 8 || { echo "skyward: $home/tools.lock still held after 900 s; is a bootstrap stuck on this host (ps -u \$(id -un))?" >&2; exit 75; }
  fi
  if usable_uv "$home/tools/bin/uv"; then uv="$home/tools/bin/uv"
  else
    uv_page=https://pypi.org/simple/uv/
    step "install uv into $home/tools/bin from $uv_page"
    install_uv "$uv_page" "$home/tools"
    uv="$home/tools/bin/uv"
  fi
  exec 8>&-
fi
if ! command -v git >/dev/null 2>&1; then
  echo "skyward: the image installs mpmd from git, and this host has no git: add it to the image (apt=[\"git\"]) or install it" >&2
  exit 127
fi
rm -rf "$env_dir"
if [ -n "$python" ]; then
  run "$uv" venv -q --no-project --python "$python" "$env_dir"
else
  python_source='GitHub (python-build-standalone releases, the uv default)'
  echo "skyward: no Python 3.11 on this host (the client runs 3.11, and cloudpickle needs the same minor version on both ends): using a uv-managed CPython 3.11 from $python_source"
  step "$uv" venv --no-project --managed-python --python 3.11 "$env_dir"
  env UV_PYTHON_INSTALL_DIR="$home/pythons" UV_PYTHON_DOWNLOADS=automatic UV_HTTP_TIMEOUT=30 UV_HTTP_RETRIES=2 \
    "$uv" venv -q --no-project --managed-python --python 3.11 "$env_dir" ||
    { status=$?; echo "skyward: error: uv could not install CPython 3.11 from $python_source: set Image(python_mirror=...) to a mirror of python-build-standalone this host can reach (and python_downloads_json_url=... for builds of your own), or install Python 3.11 on the host (the reason uv gave is above)" >&2; exit $status; }
fi
if [ ! -f "$home"/wheels/a8477c2b84196d26/jaxpp-0.1-py3-none-any.whl ]; then
  mkdir -p "$home"/wheels/a8477c2b84196d26
  step 'write jaxpp-0.1-py3-none-any.whl (0 KiB)'
  "$env_dir/bin/python" -c 'import base64, os, sys; path = sys.argv[1]; part = path + str(os.getpid()); open(part, "wb").write(base64.b64decode(sys.stdin.buffer.read())); os.replace(part, path)' "$home"/wheels/a8477c2b84196d26/jaxpp-0.1-py3-none-any.whl <<'SKYWARD_WHEEL'
UEsDBBQAAAAAAAAAIQC9UHsjEAAAABAAAAAIAAAAamF4cHAucHlWRVJTSU9OID0gJzAuMScKUEsD
BBQAAAAAAAAAIQAdF7T1LwAAAC8AAAAcAAAAamF4cHAtMC4xLmRpc3QtaW5mby9NRVRBREFUQU1l
dGFkYXRhLVZlcnNpb246IDIuMQpOYW1lOiBqYXhwcApWZXJzaW9uOiAwLjEKUEsBAhQDFAAAAAAA
AAAhAL1QeyMQAAAAEAAAAAgAAAAAAAAAAAAAAIABAAAAAGpheHBwLnB5UEsBAhQDFAAAAAAAAAAh
AB0XtPUvAAAALwAAABwAAAAAAAAAAAAAAIABNgAAAGpheHBwLTAuMS5kaXN0LWluZm8vTUVUQURB
VEFQSwUGAAAAAAIAAgCAAAAAnwAAAAAA
SKYWARD_WHEEL
fi
"$uv" --version
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
echo 69b7f04aab986746 > "$env_dir/.skyward-ready"
echo "skyward: image 69b7f04aab986746 installed"

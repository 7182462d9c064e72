# Shared by scripts/test and scripts/demo: make sure the build dependencies are
# installed (Debian packages), installing them when run as root.
# shellcheck shell=bash

# What scripts/demo needs: a compiler, CMake and xxHash (the examples hash
# blocks), nlohmann-json (the replay tool reads JSON traces), msgpack-cxx and
# ZeroMQ (the wire example). scripts/test adds the test framework and the tools
# its tests use.
PROMPTCACHE_PACKAGES=(cmake g++ libxxhash-dev nlohmann-json3-dev libmsgpack-cxx-dev cppzmq-dev libzmq3-dev)

promptcache_missing_packages() {
  local missing=() pkg
  for pkg in "${PROMPTCACHE_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  echo "${missing[@]}"
}

promptcache_ensure_packages() {
  if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "note: not a Debian system; make sure these (or their equivalents) are installed: ${PROMPTCACHE_PACKAGES[*]}" >&2
    return 0
  fi
  local missing
  missing=$(promptcache_missing_packages)
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" -eq 0 ]; then
    echo "installing: $missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing
  else
    echo "missing Debian packages: $missing" >&2
    echo "install them with: sudo apt-get install -y $missing" >&2
    exit 1
  fi
}

promptcache_jobs() { nproc 2>/dev/null || echo 2; }

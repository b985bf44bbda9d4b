#!/usr/bin/env bash
# Installs the Debian packages Lockstep needs, only those missing.
# Runs `apt-get update` only when something has to be installed.
# Usage: tools/setup.sh            (as root, or with sudo available)
set -euo pipefail

PACKAGES=(
  bazel-bootstrap
  g++
  clang               # tools/check_threads.sh: -Wthread-safety
  libclang-rt-14-dev  # ... and the TSan runtime
  libgrpc++-dev
  protobuf-compiler-grpc
  libprotobuf-dev
  protobuf-compiler
  libabsl-dev
  libtorch-dev
  libgloo-dev
  libspdlog-dev
  libfmt-dev
  libgtest-dev
  libgmock-dev
  libsqlite3-dev
  libopenblas0-pthread
  cmake               # the worker library as a CMake package (examples/cmake)
  ninja-build
  dpkg-dev            # tools/package.sh: dpkg-shlibdeps
  file
  debootstrap         # deploy/package_install_test.sh: a fresh bookworm root
  podman              # tools/container.sh: the image (podman import)
  python3-torch
  python3-grpcio
  iproute2
  procps
  systemd
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"

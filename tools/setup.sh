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
  systemd-container   # ... booted with systemd (systemd-nspawn) to run the units
  podman              # tools/container.sh: the image (podman import)
  python3-torch
  python3-grpcio
  iproute2
  iptables            # deploy:k8s_netns_test: NetworkPolicies as iptables rules
  procps
  systemd
  python3-yaml        # deploy/k8s/test/pods.py reads the rendered manifests
  prometheus          # tests/e2e:prometheus_test, deploy:grafana_dashboard_test (promtool)
  tmux                # tests/e2e:watch_tmux_test (watch on a real terminal)
  curl                # tests/e2e:prometheus_test, deploy:package_install_test (scrapes /metrics)
  openssl             # tests/e2e:tls_test (an impostor server, certificate serials)
)
# deploy:k8s_*_test: kubectl (its kustomize renders deploy/k8s) and node with
# npm (tools/k8s_validate). Any kubectl or node already on PATH will do:
# Debian's kubernetes-client would collide with another package's
# /usr/bin/kubectl, and Debian's npm with a nodejs that bundles npm.
command -v kubectl >/dev/null || PACKAGES+=(kubernetes-client)
command -v node >/dev/null || PACKAGES+=(nodejs)
command -v npm >/dev/null || PACKAGES+=(npm)

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages present"
else
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# tools/k8s_validate's npm packages, exactly as package-lock.json pins them;
# again only when node_modules is missing or was installed from another lock
# file (its hash is kept in node_modules/.lock-sha256). Tests never install.
validator="$(dirname "$0")/k8s_validate"
want=$(sha256sum "$validator/package-lock.json" | cut -d' ' -f1)
if [[ "$(cat "$validator/node_modules/.lock-sha256" 2>/dev/null)" != "$want" ]]; then
  echo "setup: npm ci in $validator"
  (cd "$validator" && npm ci --ignore-scripts --no-audit --no-fund)
  echo "$want" >"$validator/node_modules/.lock-sha256"
fi
echo "setup: done"

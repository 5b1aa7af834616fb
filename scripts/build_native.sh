#!/bin/sh
# Build the pinned llama.cpp with gguftool's types (same as `gguftool native build`).
# Usage: scripts/build_native.sh [-j N] [--force] [--portable]
set -e
cd "$(dirname "$0")/.."
exec python -m gguftool native build "$@"

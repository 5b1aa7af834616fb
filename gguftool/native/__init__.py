"""Native side: the pinned llama.cpp with gguftool's types built in.

source     fetch + verify the pinned llama-cpp-python sdist, unpack vendor/llama.cpp
integrate  anchored edits registering our types, kernels copied from gguftool/_fast
build      CMake configure/build of the CPU tools, cached by a hash of all inputs
tools      locate the built binaries
"""
from .build import TARGETS, BuildResult
from .build import build as build_native
from .source import PINNED, cache_root
from .tools import find_build, tool

__all__ = ["PINNED", "TARGETS", "BuildResult", "build_native", "cache_root", "find_build", "tool"]

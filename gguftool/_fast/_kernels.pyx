# cython: boundscheck=False, wraparound=False
"""Thin buffer-in/buffer-out wrappers over the C kernels; each type family lives in its own .pxi.

Every wrapper releases the GIL, so callers split rows across threads (gguftool.quant.parallel)."""
include "hqq.pxi"
include "tq3.pxi"

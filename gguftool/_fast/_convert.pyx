# cython: boundscheck=False, wraparound=False
"""Thin wrapper over gqt_convert.c, GIL released."""
from libc.stdint cimport int64_t, uint16_t

cdef extern from "gqt_convert.h" nogil:
    void gqt_fp16_to_fp32_n(const uint16_t * x, float * y, int64_t n)


def f16_to_f32(const uint16_t[::1] x, float[::1] out):
    """out[:] = x (fp16 bit patterns) as float32, exact."""
    if x.shape[0] != out.shape[0]:
        raise ValueError("f16_to_f32: lengths differ")
    if x.shape[0] == 0:
        return
    with nogil:
        gqt_fp16_to_fp32_n(&x[0], &out[0], x.shape[0])

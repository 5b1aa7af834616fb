# cython: boundscheck=False, wraparound=False
"""Thin wrapper over gqt_tcq3.c (TQ3_3): buffers in, buffers out, GIL released. Checks live in gguftool.quant.tcq3."""
from libc.stdint cimport int64_t, uint8_t

cdef extern from "gqt_tcq3.h" nogil:
    int GQT_OK, GQT_ERR_NONFINITE, GQT_ERR_SHAPE, GQT_ERR_RANGE
    int GQT_TQ3_3_SEARCH
    double GQT_TQ3_3_UNIT
    const signed char gqt_tq3_3_levels[16]
    void gqt_dequantize_row_tq3_3(const void * x, float * y, int64_t k)
    int gqt_tq3_3_quantize_rows(const float * src, void * dst, int64_t nrows, int64_t n_per_row)
    void gqt_vec_dot_tq3_3_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc)
    void gqt_mad_tq3_3(int64_t k, float * acc, const void * x, float s)

OK = GQT_OK
ERR_NONFINITE = GQT_ERR_NONFINITE
ERR_SHAPE = GQT_ERR_SHAPE
ERR_RANGE = GQT_ERR_RANGE
SEARCH = GQT_TQ3_3_SEARCH
UNIT = GQT_TQ3_3_UNIT
LEVELS = tuple(gqt_tq3_3_levels[k] for k in range(16))


def quantize_rows(const float[:, ::1] src, uint8_t[:, ::1] dst):
    """gqt_tq3_3_quantize_rows over a C-contiguous float32 matrix; returns the GQT_* code."""
    cdef int rc
    cdef int64_t nrows = src.shape[0], n = src.shape[1]
    if dst.shape[0] != nrows or dst.shape[1] != n // 64 * 26:
        raise ValueError("dst shape does not match src")
    if nrows == 0:
        return GQT_OK
    with nogil:
        rc = gqt_tq3_3_quantize_rows(&src[0, 0], &dst[0, 0], nrows, n)
    return rc


def dequantize_rows(const uint8_t[:, ::1] src, float[:, ::1] dst):
    cdef int64_t r, nrows = dst.shape[0], n = dst.shape[1]
    if src.shape[0] != nrows or src.shape[1] != n // 64 * 26:
        raise ValueError("src shape does not match dst")
    if nrows == 0 or n == 0:
        return
    with nogil:
        for r in range(nrows):
            gqt_dequantize_row_tq3_3(&src[r, 0], &dst[r, 0], n)


def vec_dot_rows(const uint8_t[:, ::1] x, const uint8_t[:, ::1] y, float[::1] out):
    """out[r] = gqt_vec_dot_tq3_3_q8_0(row r of x, row r of y (Q8_0))."""
    cdef int64_t r, nrows = x.shape[0]
    cdef int n = x.shape[1] // 26 * 64
    if y.shape[0] != nrows or out.shape[0] != nrows or y.shape[1] != n // 32 * 34:
        raise ValueError("x, y and out do not match")
    if nrows == 0 or n == 0:
        return
    with nogil:
        for r in range(nrows):
            gqt_vec_dot_tq3_3_q8_0(n, &out[r], 0, &x[r, 0], 0, &y[r, 0], 0, 1)


def mad_rows(const uint8_t[:, ::1] x, float[:, ::1] acc, const float[::1] s):
    """acc[r] += s[r] * row r of x, by gqt_mad_tq3_3 (flash attention's fused V accumulation)."""
    cdef int64_t r, nrows = acc.shape[0], n = acc.shape[1]
    if x.shape[0] != nrows or s.shape[0] != nrows or x.shape[1] != n // 64 * 26:
        raise ValueError("x, acc and s do not match")
    if nrows == 0 or n == 0:
        return
    with nogil:
        for r in range(nrows):
            gqt_mad_tq3_3(n, &acc[r, 0], &x[r, 0], s[r])

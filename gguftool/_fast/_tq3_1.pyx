# cython: boundscheck=False, wraparound=False
"""Thin wrapper over gqt_tq3_1.c: buffers in, buffers out, GIL released. Checks live in gguftool.quant.tq3_1.
Every function takes `per`, the code groups per block: 1 for TQ3_1 (32 values, 14 bytes), 2 for TQ3_2 (64, 26)."""
from libc.stdint cimport int64_t, uint8_t

cdef extern from "gqt_tq3_1.h" nogil:
    int GQT_OK, GQT_ERR_NONFINITE, GQT_ERR_SHAPE, GQT_ERR_RANGE
    int GQT_TQ3_1_REFINE_PASSES, GQT_TQ3_1_SEARCH
    double GQT_TQ3_1_UNIT
    const signed char gqt_tq3_1_levels[8]
    void gqt_dequantize_row_tq3_1(const void * x, float * y, int64_t k)
    void gqt_dequantize_row_tq3_2(const void * x, float * y, int64_t k)
    int gqt_tq3_1_quantize_rows(const float * src, void * dst, int64_t nrows, int64_t n_per_row)
    int gqt_tq3_2_quantize_rows(const float * src, void * dst, int64_t nrows, int64_t n_per_row)
    void gqt_vec_dot_tq3_1_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc)
    void gqt_vec_dot_tq3_2_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc)
    void gqt_mad_tq3_1(int64_t k, float * acc, const void * x, float s)
    void gqt_mad_tq3_2(int64_t k, float * acc, const void * x, float s)

OK = GQT_OK
ERR_NONFINITE = GQT_ERR_NONFINITE
ERR_SHAPE = GQT_ERR_SHAPE
ERR_RANGE = GQT_ERR_RANGE
REFINE_PASSES = GQT_TQ3_1_REFINE_PASSES
SEARCH = GQT_TQ3_1_SEARCH
UNIT = GQT_TQ3_1_UNIT
LEVELS = tuple(gqt_tq3_1_levels[k] for k in range(8))


cdef inline int64_t row_bytes(int64_t n, int per):
    """bytes of a row of n values"""
    return n // (32 * per) * (2 + 12 * per)


cdef inline void check_per(int per) except *:
    if per != 1 and per != 2:
        raise ValueError("per must be 1 (TQ3_1) or 2 (TQ3_2)")


def quantize_rows(const float[:, ::1] src, uint8_t[:, ::1] dst, int per=1):
    """gqt_tq3_{1,2}_quantize_rows over a C-contiguous float32 matrix; returns the GQT_* code."""
    cdef int rc
    cdef int64_t nrows = src.shape[0], n = src.shape[1]
    check_per(per)
    if dst.shape[0] != nrows or dst.shape[1] != row_bytes(n, per):
        raise ValueError("dst shape does not match src")
    if nrows == 0:
        return GQT_OK
    with nogil:
        if per == 1:
            rc = gqt_tq3_1_quantize_rows(&src[0, 0], &dst[0, 0], nrows, n)
        else:
            rc = gqt_tq3_2_quantize_rows(&src[0, 0], &dst[0, 0], nrows, n)
    return rc


def dequantize_rows(const uint8_t[:, ::1] src, float[:, ::1] dst, int per=1):
    cdef int64_t r, nrows = dst.shape[0], n = dst.shape[1]
    check_per(per)
    if src.shape[0] != nrows or src.shape[1] != row_bytes(n, per):
        raise ValueError("src shape does not match dst")
    if nrows == 0 or n == 0:
        return
    with nogil:
        for r in range(nrows):
            if per == 1:
                gqt_dequantize_row_tq3_1(&src[r, 0], &dst[r, 0], n)
            else:
                gqt_dequantize_row_tq3_2(&src[r, 0], &dst[r, 0], n)


def vec_dot_rows(const uint8_t[:, ::1] x, const uint8_t[:, ::1] y, float[::1] out, int per=1):
    """out[r] = gqt_vec_dot_tq3_{1,2}_q8_0(row r of x, row r of y (Q8_0))."""
    cdef int64_t r, nrows = x.shape[0]
    check_per(per)
    cdef int n = x.shape[1] // (2 + 12 * per) * 32 * per
    if y.shape[0] != nrows or out.shape[0] != nrows or y.shape[1] != n // 32 * 34:
        raise ValueError("x, y and out do not match")
    if nrows == 0 or n == 0:
        return
    with nogil:
        for r in range(nrows):
            if per == 1:
                gqt_vec_dot_tq3_1_q8_0(n, &out[r], 0, &x[r, 0], 0, &y[r, 0], 0, 1)
            else:
                gqt_vec_dot_tq3_2_q8_0(n, &out[r], 0, &x[r, 0], 0, &y[r, 0], 0, 1)


def mad_rows(const uint8_t[:, ::1] x, float[:, ::1] acc, const float[::1] s, int per=1):
    """acc[r] += s[r] * row r of x, by gqt_mad_tq3_{1,2} (flash attention's fused V accumulation)."""
    cdef int64_t r, nrows = acc.shape[0], n = acc.shape[1]
    check_per(per)
    if x.shape[0] != nrows or s.shape[0] != nrows or x.shape[1] != row_bytes(n, per):
        raise ValueError("x, acc and s do not match")
    if nrows == 0 or n == 0:
        return
    with nogil:
        for r in range(nrows):
            if per == 1:
                gqt_mad_tq3_1(n, &acc[r, 0], &x[r, 0], s[r])
            else:
                gqt_mad_tq3_2(n, &acc[r, 0], &x[r, 0], s[r])

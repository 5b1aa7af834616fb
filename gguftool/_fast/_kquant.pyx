# cython: boundscheck=False, wraparound=False
"""Thin wrapper over kq_search.c: buffers in, buffers out, GIL released. Checks live in quant/kquant.py."""
from libc.stdint cimport int64_t, uint8_t

cdef extern from "kq_search.h" nogil:
    int GQT_KQ_Q4_K, GQT_KQ_Q5_K, GQT_KQ_Q6_K, GQT_KQ_ROUNDS_MAX
    int GQT_KQ_OK, GQT_KQ_ERR_TYPE, GQT_KQ_ERR_SHAPE, GQT_KQ_ERR_NONFINITE, GQT_KQ_ERR_PARAM
    int64_t gqt_kq_row_size(int type, int64_t n_per_row)
    int gqt_kq_refine_rows(int type, const float * x, const float * w, void * blocks, int64_t nrows,
                           int64_t n_per_row, int rounds, double * err_before, double * err_after)
    int gqt_kq_block_errors(int type, const float * x, const float * w, const void * blocks, int64_t nrows,
                            int64_t n_per_row, double * out)
    int gqt_kq_dequantize_rows(int type, const void * blocks, float * y, int64_t nrows, int64_t n_per_row)

TYPES = {"Q4_K": GQT_KQ_Q4_K, "Q5_K": GQT_KQ_Q5_K, "Q6_K": GQT_KQ_Q6_K}
ROUNDS_MAX = GQT_KQ_ROUNDS_MAX
OK, ERR_TYPE, ERR_SHAPE, ERR_NONFINITE, ERR_PARAM = (GQT_KQ_OK, GQT_KQ_ERR_TYPE, GQT_KQ_ERR_SHAPE,
                                                     GQT_KQ_ERR_NONFINITE, GQT_KQ_ERR_PARAM)


def row_size(int t, int64_t n_per_row):
    return gqt_kq_row_size(t, n_per_row)


def refine_rows(int t, const float[:, ::1] x, const float[::1] w, uint8_t[:, ::1] blocks, int rounds):
    """(rc, error before, error after); blocks changed in place. w: None or n_per_row weights."""
    cdef double before = 0, after = 0
    cdef const float * wp = NULL
    cdef int rc
    if w is not None:
        wp = &w[0]
    if x.shape[0] != blocks.shape[0]:
        return ERR_SHAPE, 0.0, 0.0
    if x.shape[0] == 0:
        return OK, 0.0, 0.0
    if blocks.shape[1] != gqt_kq_row_size(t, x.shape[1]) or (w is not None and w.shape[0] != x.shape[1]):
        return ERR_SHAPE, 0.0, 0.0
    with nogil:
        rc = gqt_kq_refine_rows(t, &x[0, 0], wp, &blocks[0, 0], x.shape[0], x.shape[1], rounds, &before, &after)
    return rc, before, after


def block_errors(int t, const float[:, ::1] x, const float[::1] w, const uint8_t[:, ::1] blocks, double[::1] out):
    cdef const float * wp = NULL
    cdef int rc
    if w is not None:
        wp = &w[0]
    if x.shape[0] != blocks.shape[0] or blocks.shape[1] != gqt_kq_row_size(t, x.shape[1]) \
            or out.shape[0] != x.shape[0] * (x.shape[1] // 256) or (w is not None and w.shape[0] != x.shape[1]):
        return ERR_SHAPE
    if x.shape[0] == 0:
        return OK
    with nogil:
        rc = gqt_kq_block_errors(t, &x[0, 0], wp, &blocks[0, 0], x.shape[0], x.shape[1], &out[0])
    return rc


def dequantize_rows(int t, const uint8_t[:, ::1] blocks, float[:, ::1] y):
    cdef int rc
    if blocks.shape[0] != y.shape[0] or blocks.shape[1] != gqt_kq_row_size(t, y.shape[1]):
        return ERR_SHAPE
    if y.shape[0] == 0:
        return OK
    with nogil:
        rc = gqt_kq_dequantize_rows(t, &blocks[0, 0], &y[0, 0], y.shape[0], y.shape[1])
    return rc

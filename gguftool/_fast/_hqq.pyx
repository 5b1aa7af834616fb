# cython: boundscheck=False, wraparound=False
"""Thin wrapper over gqt_hqq.c: buffers in, buffers out, GIL released. Checks live in quant/hqq.py."""
from libc.stdint cimport int64_t

cdef extern from "gqt_hqq.h" nogil:
    ctypedef struct gqt_hqq_params:
        float lp_norm
        float beta
        float kappa
        int iters
        int early_stop
        int scale_search
        int refit
    int GQT_OK, GQT_ERR_NONFINITE, GQT_ERR_SHAPE, GQT_ERR_RANGE, GQT_ERR_PARAM
    int GQT_TYPE_Q4_HQQ, GQT_TYPE_Q4_HQQ_128, GQT_Q4_HQQ_BLOCK, GQT_Q4_HQQ_128_BLOCK
    int GQT_HQQ_SCALE_SEARCH_MAX, GQT_HQQ_REFIT_MAX, GQT_HQQ_ITERS_MAX, GQT_HQQ_WEIGHTED_SCALE_SEARCH
    float GQT_HQQ_S_INV_CAP, GQT_HQQ_ZERO_CAP
    float gqt_hqq_scale_step(int i)
    int gqt_hqq_quantize_rows(int target, const float * src, void * dst, int64_t nrows, int64_t n_per_row,
                              const gqt_hqq_params * p)
    int gqt_hqq_quantize_rows_weighted(int target, const float * src, void * dst, int64_t nrows, int64_t n_per_row,
                                       const gqt_hqq_params * p, const float * weights, int64_t weights_stride)
    int gqt_hqq_dequantize_rows(int target, const void * src, float * dst, int64_t nrows, int64_t n_per_row)
    size_t gqt_hqq_row_size(int target, int64_t n_per_row)
    void gqt_hqq_default_params(gqt_hqq_params * p)
    void gqt_vec_dot_q4_hqq_q8_1_ref(int n, float * s, size_t bs, const void * vx, size_t bx,
                                     const void * vy, size_t by, int nrc)
    void gqt_vec_dot_q4_hqq_128_q8_1_ref(int n, float * s, size_t bs, const void * vx, size_t bx,
                                         const void * vy, size_t by, int nrc)
    void gqt_vec_dot_q4_hqq_q8_1(int n, float * s, size_t bs, const void * vx, size_t bx,
                                 const void * vy, size_t by, int nrc)
    void gqt_vec_dot_q4_hqq_128_q8_1(int n, float * s, size_t bs, const void * vx, size_t bx,
                                     const void * vy, size_t by, int nrc)
    void gqt_quantize_row_q4_hqq_ref(const float * x, void * y, int64_t k)
    void gqt_quantize_row_q4_hqq_128_ref(const float * x, void * y, int64_t k)
    size_t gqt_quantize_q4_hqq(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix)
    size_t gqt_quantize_q4_hqq_128(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix)
    void gqt_dequantize_row_q4_hqq(const void * x, float * y, int64_t k)
    void gqt_dequantize_row_q4_hqq_128(const void * x, float * y, int64_t k)

# What gqt_hqq.h owns, for the numpy reference and the checks in quant/hqq.py.
OK, ERR_NONFINITE, ERR_SHAPE, ERR_RANGE, ERR_PARAM = GQT_OK, GQT_ERR_NONFINITE, GQT_ERR_SHAPE, GQT_ERR_RANGE, GQT_ERR_PARAM
SCALE_SEARCH_MAX = GQT_HQQ_SCALE_SEARCH_MAX
REFIT_MAX = GQT_HQQ_REFIT_MAX
WEIGHTED_SCALE_SEARCH = GQT_HQQ_WEIGHTED_SCALE_SEARCH
ITERS_MAX = GQT_HQQ_ITERS_MAX
S_INV_CAP = GQT_HQQ_S_INV_CAP
ZERO_CAP = GQT_HQQ_ZERO_CAP
SCALE_STEPS = tuple(gqt_hqq_scale_step(i) for i in range(2 * GQT_HQQ_SCALE_SEARCH_MAX))


cdef inline bint ours(int target):
    """Q4_HQQ or Q4_HQQ_128: the types with ggml entry points (the stock targets have ggml's own)."""
    return target == GQT_TYPE_Q4_HQQ or target == GQT_TYPE_Q4_HQQ_128


def default_params():
    cdef gqt_hqq_params p
    gqt_hqq_default_params(&p)
    return dict(lp_norm=p.lp_norm, beta=p.beta, kappa=p.kappa, iters=p.iters,
                early_stop=p.early_stop, scale_search=p.scale_search, refit=p.refit)


def quantize_rows(int target, const float[:, ::1] x, unsigned char[:, ::1] out, float lp_norm, float beta,
                  float kappa, int iters, int early_stop, int scale_search, int refit, weights=None):
    """x [rows, n] -> out [rows, row_bytes]; returns the C status code (0 = GQT_OK). weights: None, or float32
    importance weights [1, n] (per column, for every row) or [rows, n] (per value)."""
    cdef gqt_hqq_params p
    cdef int rc
    cdef const float[:, ::1] w
    cdef const float * wp = NULL
    cdef int64_t stride = 0
    p.lp_norm, p.beta, p.kappa = lp_norm, beta, kappa
    p.iters, p.early_stop, p.scale_search, p.refit = iters, early_stop, scale_search, refit
    if x.shape[0] != out.shape[0] or <size_t> out.shape[1] != gqt_hqq_row_size(target, x.shape[1]):
        return GQT_ERR_SHAPE
    if weights is not None:
        w = weights
        if w.shape[1] != x.shape[1] or (w.shape[0] != 1 and w.shape[0] != x.shape[0]):
            return GQT_ERR_SHAPE
        stride = 0 if w.shape[0] == 1 else w.shape[1]
    if x.shape[0] == 0:
        return GQT_OK
    if weights is not None:
        wp = &w[0, 0]
    with nogil:
        rc = gqt_hqq_quantize_rows_weighted(target, &x[0, 0], &out[0, 0], x.shape[0], x.shape[1], &p, wp, stride)
    return rc


def quantize_rows_default(int target, const float[:, ::1] x, unsigned char[:, ::1] out):
    """The ggml type-trait entry points (quantize_q4_hqq*: default parameters); returns bytes written."""
    cdef size_t n
    if not ours(target):
        raise ValueError("quantize_rows_default: target must be Q4_HQQ or Q4_HQQ_128")
    if x.shape[0] == 0:
        return 0
    if <size_t> out.shape[1] != gqt_hqq_row_size(target, x.shape[1]) or out.shape[0] != x.shape[0]:
        raise ValueError("shape")
    with nogil:
        if target == GQT_TYPE_Q4_HQQ:
            n = gqt_quantize_q4_hqq(&x[0, 0], &out[0, 0], x.shape[0], x.shape[1], NULL)
        else:
            n = gqt_quantize_q4_hqq_128(&x[0, 0], &out[0, 0], x.shape[0], x.shape[1], NULL)
    return n


def quantize_row_ref(int target, const float[::1] x, unsigned char[::1] out):
    """gqt_quantize_row_q4_hqq*_ref (defaults; ggml's from_float and from_float_ref) over one row (k = len(x))."""
    if not ours(target) or <size_t> out.shape[0] != gqt_hqq_row_size(target, x.shape[0]) or x.shape[0] == 0:
        raise ValueError("quantize_row_ref: bad target or sizes")
    with nogil:
        if target == GQT_TYPE_Q4_HQQ:
            gqt_quantize_row_q4_hqq_ref(&x[0], &out[0], x.shape[0])
        else:
            gqt_quantize_row_q4_hqq_128_ref(&x[0], &out[0], x.shape[0])


def dequantize_rows(int target, const unsigned char[:, ::1] data, float[:, ::1] out):
    cdef int rc
    if out.shape[0] != data.shape[0] or <size_t> data.shape[1] != gqt_hqq_row_size(target, out.shape[1]):
        return GQT_ERR_SHAPE
    if out.shape[0] == 0:
        return GQT_OK
    with nogil:
        rc = gqt_hqq_dequantize_rows(target, &data[0, 0], &out[0, 0], out.shape[0], out.shape[1])
    return rc


def dequantize_row(int target, const unsigned char[::1] data, float[::1] out):
    """gqt_dequantize_row_q4_hqq* over one row."""
    if not ours(target) or <size_t> data.shape[0] != gqt_hqq_row_size(target, out.shape[0]) or out.shape[0] == 0:
        raise ValueError("dequantize_row: bad target or sizes")
    with nogil:
        if target == GQT_TYPE_Q4_HQQ:
            gqt_dequantize_row_q4_hqq(&data[0], &out[0], out.shape[0])
        else:
            gqt_dequantize_row_q4_hqq_128(&data[0], &out[0], out.shape[0])


def vec_dot_q8_1(int target, const unsigned char[::1] x, const unsigned char[::1] y, int n, bint simd=False):
    """ggml-style vec_dot of one row of `target` blocks with one row of block_q8_1 (36 B per 32): the
    scalar reference, or (simd) the kernel ggml-cpu registers, SIMD where this build has it."""
    cdef float s = 0
    if not ours(target) or n % (GQT_Q4_HQQ_BLOCK if target == GQT_TYPE_Q4_HQQ else GQT_Q4_HQQ_128_BLOCK) or <size_t> x.shape[0] != gqt_hqq_row_size(target, n) \
            or y.shape[0] != n // 32 * 36:
        raise ValueError("vec_dot_q8_1: sizes do not match n")
    if n == 0:
        return 0.0
    with nogil:
        if target == GQT_TYPE_Q4_HQQ:
            (gqt_vec_dot_q4_hqq_q8_1 if simd else gqt_vec_dot_q4_hqq_q8_1_ref)(n, &s, 0, &x[0], 0, &y[0], 0, 1)
        else:
            (gqt_vec_dot_q4_hqq_128_q8_1 if simd else gqt_vec_dot_q4_hqq_128_q8_1_ref)(n, &s, 0, &x[0], 0, &y[0], 0, 1)
    return s

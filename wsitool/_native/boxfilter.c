/* wsitool._boxfilter: the 2:1 integer box sum of the export pyramid, in C.
 *
 * halve(src, dst, rows, width, src_itemsize, dst_itemsize) reads `rows` rows of
 * `width` RGB pixels from `src` (C-contiguous, unsigned integers of
 * `src_itemsize` bytes: 1, 2, 4 or 8) and writes ceil(rows / 2) rows of
 * ceil(width / 2) pixels to `dst` (C-contiguous, unsigned of `dst_itemsize`
 * bytes, at least the source's): each output sample is the sum of the (up to)
 * 2 x 2 source samples it covers; a last row or column without a partner is
 * summed alone.  This is exactly what wsitool/export/downsample.py's numpy
 * reference (halve_rows_numpy) computes, which stays the reference:
 * tests/export/test_boxfilter.py pins this kernel to it on odd and even sizes
 * and every type pair.  The sums cannot overflow for the type pairs the
 * pyramid uses (wsitool.export.plan.sum_dtype).
 *
 * means(...) turns such sums into uint8 means, rounding half up (the reference:
 * wsitool/export/downsample.py means_numpy).
 *
 * The GIL is released for the whole call, so the export's reader and encoder
 * threads run beside it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#define HALVE(NAME, TS, TD)                                                              \
    static void NAME(const void *s_, void *d_, Py_ssize_t rows, Py_ssize_t width) {       \
        const TS *s = (const TS *)s_;                                                     \
        TD *d = (TD *)d_;                                                                 \
        Py_ssize_t half = width / 2, ow = (width + 1) / 2, stride = width * 3;            \
        Py_ssize_t pairs = rows / 2;                                                      \
        for (Py_ssize_t r = 0; r < pairs; r++) {                                          \
            const TS *a = s + 2 * r * stride, *b = a + stride;                            \
            TD *o = d + r * ow * 3;                                                       \
            for (Py_ssize_t x = 0; x < half; x++) {                                       \
                const TS *pa = a + 6 * x, *pb = b + 6 * x;                                \
                o[3 * x + 0] = (TD)((TD)pa[0] + pa[3] + pb[0] + pb[3]);                   \
                o[3 * x + 1] = (TD)((TD)pa[1] + pa[4] + pb[1] + pb[4]);                   \
                o[3 * x + 2] = (TD)((TD)pa[2] + pa[5] + pb[2] + pb[5]);                   \
            }                                                                             \
            if (width & 1) {                                                              \
                const TS *pa = a + 3 * (width - 1), *pb = b + 3 * (width - 1);            \
                for (int c = 0; c < 3; c++) o[3 * half + c] = (TD)((TD)pa[c] + pb[c]);    \
            }                                                                             \
        }                                                                                 \
        if (rows & 1) {                                                                   \
            const TS *a = s + (rows - 1) * stride;                                        \
            TD *o = d + pairs * ow * 3;                                                   \
            for (Py_ssize_t x = 0; x < half; x++)                                         \
                for (int c = 0; c < 3; c++)                                               \
                    o[3 * x + c] = (TD)((TD)a[6 * x + c] + a[6 * x + 3 + c]);              \
            if (width & 1)                                                                \
                for (int c = 0; c < 3; c++) o[3 * half + c] = (TD)a[3 * (width - 1) + c]; \
        }                                                                                 \
    }

HALVE(halve_8_16, uint8_t, uint16_t)
HALVE(halve_16_16, uint16_t, uint16_t)
HALVE(halve_16_32, uint16_t, uint32_t)
HALVE(halve_32_32, uint32_t, uint32_t)
HALVE(halve_32_64, uint32_t, uint64_t)
HALVE(halve_64_64, uint64_t, uint64_t)

/* means: dst (uint8) = the rounded mean (S + n / 2) / n of each sum S of src, where n is
 * the count of level-0 pixels the sum covers: 4**k inside the image, fewer in the last
 * column (cov_x columns) and, when last_row is set, the last row (cov_y rows). */
#define MEANS(NAME, TS)                                                                   \
    static void NAME(const void *s_, uint8_t *d, Py_ssize_t rows, Py_ssize_t width, int k, \
                     uint64_t cov_x, uint64_t cov_y, int last_row) {                       \
        const TS *s = (const TS *)s_;                                                     \
        const uint64_t full = (uint64_t)1 << k;                                           \
        const int shift = 2 * k;                                                          \
        const uint64_t round = (uint64_t)1 << (shift - 1);                                \
        for (Py_ssize_t r = 0; r < rows; r++) {                                           \
            const TS *a = s + r * width * 3;                                              \
            uint8_t *o = d + r * width * 3;                                               \
            uint64_t ny = (last_row && r == rows - 1) ? cov_y : full;                     \
            Py_ssize_t inner = (ny == full && cov_x == full) ? width : width - 1;         \
            if (ny == full) {                                                             \
                for (Py_ssize_t i = 0; i < inner * 3; i++)                                \
                    o[i] = (uint8_t)(((uint64_t)a[i] + round) >> shift);                  \
            } else {                                                                      \
                uint64_t n = ny * full;                                                   \
                for (Py_ssize_t i = 0; i < inner * 3; i++)                                \
                    o[i] = (uint8_t)(((uint64_t)a[i] + n / 2) / n);                       \
            }                                                                             \
            if (inner < width) {                                                          \
                uint64_t n = ny * cov_x;                                                  \
                for (int c = 0; c < 3; c++)                                               \
                    o[3 * inner + c] = (uint8_t)(((uint64_t)a[3 * inner + c] + n / 2) / n); \
            }                                                                             \
        }                                                                                 \
    }

MEANS(means_16, uint16_t)
MEANS(means_32, uint32_t)
MEANS(means_64, uint64_t)

/* 0 when both buffers are C-contiguous and hold `rows` x `width` RGB samples of `si`
 * bytes (src) and `drows` x `dwidth` of `di` bytes (dst), else -1 with a ValueError set.
 * Sizes are bounded before the byte counts are computed, so these cannot overflow. */
static int check_buffers(Py_buffer *src, Py_buffer *dst, Py_ssize_t rows, Py_ssize_t width, int si,
                         Py_ssize_t drows, Py_ssize_t dwidth, int di) {
    /* rows * width * 24 (8-byte samples) must fit: width <= 2**30 keeps width * 24 small */
    if (rows < 0 || width < 0 || width > (1 << 30) ||
        (width > 0 && rows > PY_SSIZE_T_MAX / (width * 24))) {
        PyErr_SetString(PyExc_ValueError, "rows and width must be >= 0 and their product small "
                                          "enough to address");
        return -1;
    }
    Py_ssize_t need_src = rows * width * 3 * si, need_dst = drows * dwidth * 3 * di;
    if (!PyBuffer_IsContiguous(src, 'C') || !PyBuffer_IsContiguous(dst, 'C')) {
        PyErr_SetString(PyExc_ValueError, "source and destination must be C-contiguous");
        return -1;
    }
    if (src->len < need_src || dst->len < need_dst) {
        PyErr_SetString(PyExc_ValueError, "buffer too small for the rows and width given");
        return -1;
    }
    return 0;
}

static PyObject *py_means(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    Py_ssize_t rows, width;
    int si, k, last_row;
    unsigned long long cov_x, cov_y;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*nniiKKp", &src, &dst, &rows, &width, &si, &k, &cov_x, &cov_y,
                          &last_row))
        return NULL;
    PyObject *result = NULL;
    if (k < 1 || k > 31 || cov_x < 1 || cov_y < 1 || cov_x > (1ULL << k) || cov_y > (1ULL << k) ||
        width < 1) {
        PyErr_SetString(PyExc_ValueError, "bad level, coverage or size");
        goto done;
    }
    if (check_buffers(&src, &dst, rows, width, si, rows, width, 1) < 0) goto done;
    void (*fn)(const void *, uint8_t *, Py_ssize_t, Py_ssize_t, int, uint64_t, uint64_t, int) =
        si == 2 ? means_16 : si == 4 ? means_32 : si == 8 ? means_64 : NULL;
    if (fn == NULL) {
        PyErr_Format(PyExc_ValueError, "no means of %d-byte sums", si);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    fn(src.buf, (uint8_t *)dst.buf, rows, width, k, cov_x, cov_y, last_row);
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

typedef void (*halve_fn)(const void *, void *, Py_ssize_t, Py_ssize_t);

static halve_fn pick(int si, int di) {
    if (si == 1 && di == 2) return halve_8_16;
    if (si == 2 && di == 2) return halve_16_16;
    if (si == 2 && di == 4) return halve_16_32;
    if (si == 4 && di == 4) return halve_32_32;
    if (si == 4 && di == 8) return halve_32_64;
    if (si == 8 && di == 8) return halve_64_64;
    return NULL;
}

static PyObject *py_halve(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    Py_ssize_t rows, width;
    int si, di;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*nnii", &src, &dst, &rows, &width, &si, &di)) return NULL;
    PyObject *result = NULL;
    halve_fn fn = pick(si, di);
    if (fn == NULL) {
        PyErr_Format(PyExc_ValueError, "no 2:1 sum from %d-byte to %d-byte samples", si, di);
        goto done;
    }
    if (check_buffers(&src, &dst, rows, width, si, (rows + 1) / 2, (width + 1) / 2, di) < 0) goto done;
    Py_BEGIN_ALLOW_THREADS
    fn(src.buf, dst.buf, rows, width);
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

static PyMethodDef methods[] = {
    {"halve", py_halve, METH_VARARGS,
     "halve(src, dst, rows, width, src_itemsize, dst_itemsize): 2:1 box sums of RGB rows."},
    {"means", py_means, METH_VARARGS,
     "means(src, dst, rows, width, src_itemsize, k, cov_x, cov_y, last_row): rounded uint8 "
     "means of level-k sums."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "wsitool._boxfilter",
                                    "2:1 integer box sums of RGB rows and their means (the export pyramid).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__boxfilter(void) { return PyModule_Create(&module); }

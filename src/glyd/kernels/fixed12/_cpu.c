/* CPU kernels of the fixed12 layout (glyd.kernels.fixed12._cpu): a one-pass unpack of a row range and a
 * decode-and-multiply for a few rows of x. Launcher, checks and docs: glyd/kernels/fixed12/cpu.py.
 *
 * fixed12 (docs/format.md): lo [N, Kp] uint8 (the bf16 low bytes, raw); code [N, Kp/2] uint8, byte j
 * of 64-weight group g holds weight g*64+j in its low nibble and g*64+32+j in its high nibble; a
 * nibble is sign<<3 | (exponent>>1) - base. Exceptions: exc_idx (flat r*K+c, strictly increasing,
 * int32 or int64) with their true high bytes exc_hi.
 *
 * Every pointer is checked by the launcher (dtype, shape, contiguity, device); here every index
 * read from the data is bounds-checked before use, so no value in a hostile file can make these
 * functions read or write outside the arrays. Values the format forbids (base > 120, exceptions
 * out of order or out of range) return an error code instead of a wrong result.
 *
 * Built by setuptools as an optional extension (setup.py); with no C compiler glyd runs the
 * pure-torch twin. AVX2 code is compiled for x86-64 with a target attribute and chosen at run
 * time; every other CPU runs the portable loops.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define GLYD_X86 1
#endif

#define GROUP 64
#define HALF 32
#define MAX_BASE 120

enum { OK = 0, ERR_BASE = 1, ERR_RANGE = 2, ERR_ORDER = 3, ERR_MEMORY = 4, ERR_INDEX = 5 };

typedef struct {
    const uint8_t *lo, *code, *exc_hi;
    const void *exc_idx;
    int idx64;           /* exc_idx is int64 (else int32) */
    int64_t nexc, n, k, kp;
    uint8_t lut[16];     /* nibble -> high byte */
} Matrix;

static int64_t exc_at(const Matrix *w, int64_t e) {
    return w->idx64 ? ((const int64_t *)w->exc_idx)[e] : (int64_t)((const int32_t *)w->exc_idx)[e];
}

/* The first exception whose flat index is >= flat (binary search; any order is memory-safe). */
static int64_t exc_lower_bound(const Matrix *w, int64_t flat) {
    int64_t lo = 0, hi = w->nexc;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (exc_at(w, mid) < flat) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static void decode_row_portable(const Matrix *w, int64_t r, uint16_t *out) {
    const uint8_t *L = w->lo + r * w->kp, *C = w->code + r * (w->kp / 2);
    for (int64_t g = 0; g < w->kp; g += GROUP) {
        for (int j = 0; j < HALF; j++) {
            uint8_t c = C[g / 2 + j];
            out[g + j] = (uint16_t)(((uint16_t)w->lut[c & 15] << 8) | L[g + j]);
            out[g + HALF + j] = (uint16_t)(((uint16_t)w->lut[c >> 4] << 8) | L[g + HALF + j]);
        }
    }
}

#ifdef GLYD_X86
__attribute__((target("avx2"))) static void decode_row_avx2(const Matrix *w, int64_t r, uint16_t *out) {
    const uint8_t *L = w->lo + r * w->kp, *C = w->code + r * (w->kp / 2);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)w->lut));
    const __m256i nib = _mm256_set1_epi8(0x0f);
    for (int64_t g = 0; g < w->kp; g += GROUP) {
        __m256i c = _mm256_loadu_si256((const __m256i *)(C + g / 2));
        __m256i hi[2] = {_mm256_shuffle_epi8(lut, _mm256_and_si256(c, nib)),
                         _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(c, 4), nib))};
        for (int h = 0; h < 2; h++) {
            __m256i lo = _mm256_loadu_si256((const __m256i *)(L + g + h * HALF));
            /* per 128-bit lane: unpacklo = words 0-7 | 16-23, unpackhi = 8-15 | 24-31 */
            __m256i a = _mm256_unpacklo_epi8(lo, hi[h]), b = _mm256_unpackhi_epi8(lo, hi[h]);
            _mm256_storeu_si256((__m256i *)(out + g + h * HALF), _mm256_permute2x128_si256(a, b, 0x20));
            _mm256_storeu_si256((__m256i *)(out + g + h * HALF + 16), _mm256_permute2x128_si256(a, b, 0x31));
        }
    }
}
#endif

/* -1: what the CPU has; 0: the portable loops (set_portable, for tests). */
static int forced = -1;

static int have_avx2(void) {
#ifdef GLYD_X86
    static int known = -1;
    if (forced == 0) return 0;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return known;
#else
    return 0;
#endif
}

/* Row r's kp words into out (bit for bit, exceptions patched); *e walks the exceptions forward. */
static int decode_row(const Matrix *w, int64_t r, uint16_t *out, int64_t *e) {
#ifdef GLYD_X86
    if (have_avx2()) decode_row_avx2(w, r, out); else
#endif
    decode_row_portable(w, r, out);
    const int64_t start = r * w->k, end = start + w->k;
    int64_t prev = -1;
    for (; *e < w->nexc; (*e)++) {
        int64_t flat = exc_at(w, *e);
        if (flat >= end) break;
        if (flat < start || flat <= prev) return ERR_ORDER;
        int64_t c = flat - start;
        out[c] = (uint16_t)(((uint16_t)w->exc_hi[*e] << 8) | (out[c] & 0xff));
        prev = flat;
    }
    return OK;
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* fp32 -> bf16, round to nearest even, NaN -> 0x7fc0: c10::BFloat16's rounding. */
static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float dot_portable(const float *x, const uint16_t *wrow, int64_t k) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t c = 0;
    for (; c + 8 <= k; c += 8)
        for (int i = 0; i < 8; i++) s[i] += x[c + i] * bf16_to_f32(wrow[c + i]);
    for (; c < k; c++) s[0] += x[c] * bf16_to_f32(wrow[c]);
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

#ifdef GLYD_X86
__attribute__((target("avx2,fma"))) static float dot_avx2(const float *x, const uint16_t *wrow, int64_t k) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t c = 0;
    for (; c + 32 <= k; c += 32)
        for (int i = 0; i < 4; i++) {
            __m256i wi = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(wrow + c + 8 * i)));
            acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + c + 8 * i), _mm256_castsi256_ps(_mm256_slli_epi32(wi, 16)),
                                     acc[i]);
        }
    for (; c + 8 <= k; c += 8) {
        __m256i wi = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(wrow + c)));
        acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + c), _mm256_castsi256_ps(_mm256_slli_epi32(wi, 16)), acc[0]);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    float t = _mm_cvtss_f32(h);
    for (; c < k; c++) t += x[c] * bf16_to_f32(wrow[c]);
    return t;
}
#endif

static float dot(const float *x, const uint16_t *wrow, int64_t k) {
#ifdef GLYD_X86
    if (have_avx2()) return dot_avx2(x, wrow, k);
#endif
    return dot_portable(x, wrow, k);
}

static int matrix_init(Matrix *w, int base) {
    if (base < 0 || base > MAX_BASE) return ERR_BASE;
    for (int c = 0; c < 16; c++) w->lut[c] = (uint8_t)(((c & 8) << 4) | ((c & 7) + base));
    return OK;
}

/* Rows [r0, r1) as bf16 bits into out [r1 - r0, k]. */
static int unpack_rows(const Matrix *w, int64_t r0, int64_t r1, uint16_t *out) {
    uint16_t *row = malloc((size_t)w->kp * sizeof(uint16_t));
    if (!row) return ERR_MEMORY;
    int64_t e = exc_lower_bound(w, r0 * w->k);
    int err = OK;
    for (int64_t r = r0; r < r1 && err == OK; r++) {
        err = decode_row(w, r, row, &e);
        memcpy(out + (r - r0) * w->k, row, (size_t)w->k * sizeof(uint16_t));
    }
    free(row);
    return err;
}

static float bias_at(const void *bias, int bf16, int64_t r) {
    if (!bias) return 0.0f;
    return bf16 ? bf16_to_f32(((const uint16_t *)bias)[r]) : ((const float *)bias)[r];
}

static void store_out(void *out, int bf16, int64_t at, float y) {
    if (bf16) ((uint16_t *)out)[at] = f32_to_bf16(y);
    else ((float *)out)[at] = y;
}

/* The portable product: each row decoded into a buffer of words, patched, dotted with every x row. */
static int linear_rows_portable(const Matrix *w, const float *x, int64_t m, int64_t r0, int64_t r1,
                                const void *bias, void *out, int bf16) {
    uint16_t *row = malloc((size_t)w->kp * sizeof(uint16_t));
    if (!row) return ERR_MEMORY;
    int64_t e = exc_lower_bound(w, r0 * w->k);
    int err = OK;
    for (int64_t r = r0; r < r1 && err == OK; r++) {
        err = decode_row(w, r, row, &e);
        for (int64_t i = 0; i < m; i++) store_out(out, bf16, i * w->n + r, dot(x + i * w->k, row, w->k) + bias_at(bias, bf16, r));
    }
    free(row);
    return err;
}

#ifdef GLYD_X86
/* Where weight t of a 32-weight half lands after unpack{lo,hi}_epi8 then unpack{lo,hi}_epi16 (per
 * 128-bit lane): x is laid out in this order once, so the decode needs no lane permutes. */
static const int LANE_ORDER[32] = {0,  1,  2,  3,  16, 17, 18, 19, 4,  5,  6,  7,  20, 21, 22, 23,
                                   8,  9,  10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};

/* y[i] += x[i][c] * (true - placeholder) for the exceptions of row r (the decode used the placeholder). */
static int correct_row(const Matrix *w, int64_t r, const float *x, int64_t m, float *y, int64_t *e) {
    const int64_t start = r * w->k, end = start + w->k;
    int64_t prev = -1;
    for (; *e < w->nexc; (*e)++) {
        int64_t flat = exc_at(w, *e);
        if (flat >= end) break;
        if (flat < start || flat <= prev) return ERR_ORDER;
        int64_t c = flat - start, g = c / GROUP * GROUP, j = c % GROUP;
        uint8_t code = w->code[r * (w->kp / 2) + g / 2 + j % HALF], lo = w->lo[r * w->kp + c];
        float ph = bf16_to_f32((uint16_t)((w->lut[j < HALF ? code & 15 : code >> 4] << 8) | lo));
        float tr = bf16_to_f32((uint16_t)((w->exc_hi[*e] << 8) | lo));
        for (int64_t i = 0; i < m; i++) y[i] += x[i * w->k + c] * tr - x[i * w->k + c] * ph;
        prev = flat;
    }
    return OK;
}

/* y[i] = x[i] . W[r] for every x row: row r decoded 64 weights at a time into eight fp32 vectors
 * (LANE_ORDER), multiplied in registers; acc holds 8 partial sums a row of x (unaligned). */
__attribute__((target("avx2,fma"))) static void dot_row_avx2(const Matrix *w, int64_t r, const float *xp,
                                                             int64_t m, float *acc, float *y) {
    const uint8_t *L = w->lo + r * w->kp, *C = w->code + r * (w->kp / 2);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)w->lut));
    const __m256i nib = _mm256_set1_epi8(0x0f), zero = _mm256_setzero_si256();
    memset(acc, 0, (size_t)m * 8 * sizeof(float));
    for (int64_t g = 0; g < w->kp; g += GROUP) {
        __m256i c = _mm256_loadu_si256((const __m256i *)(C + g / 2)), v[8];
        __m256i hi[2] = {_mm256_shuffle_epi8(lut, _mm256_and_si256(c, nib)),
                         _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(c, 4), nib))};
        for (int h = 0; h < 2; h++) {
            __m256i lo = _mm256_loadu_si256((const __m256i *)(L + g + h * HALF));
            __m256i a = _mm256_unpacklo_epi8(lo, hi[h]), b = _mm256_unpackhi_epi8(lo, hi[h]);
            v[4 * h + 0] = _mm256_unpacklo_epi16(zero, a);
            v[4 * h + 1] = _mm256_unpackhi_epi16(zero, a);
            v[4 * h + 2] = _mm256_unpacklo_epi16(zero, b);
            v[4 * h + 3] = _mm256_unpackhi_epi16(zero, b);
        }
        for (int64_t i = 0; i < m; i++) {
            const float *xi = xp + i * w->kp + g;
            __m256 s0 = _mm256_mul_ps(_mm256_castsi256_ps(v[0]), _mm256_loadu_ps(xi));
            __m256 s1 = _mm256_mul_ps(_mm256_castsi256_ps(v[1]), _mm256_loadu_ps(xi + 8));
            for (int t = 2; t < 8; t += 2) {
                s0 = _mm256_fmadd_ps(_mm256_castsi256_ps(v[t]), _mm256_loadu_ps(xi + 8 * t), s0);
                s1 = _mm256_fmadd_ps(_mm256_castsi256_ps(v[t + 1]), _mm256_loadu_ps(xi + 8 * t + 8), s1);
            }
            _mm256_storeu_ps(acc + 8 * i, _mm256_add_ps(_mm256_loadu_ps(acc + 8 * i), _mm256_add_ps(s0, s1)));
        }
    }
    for (int64_t i = 0; i < m; i++) {
        __m256 s = _mm256_loadu_ps(acc + 8 * i);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        y[i] = _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
    }
}

/* The AVX2 product: x laid out in LANE_ORDER (zero past k), each row decoded once for every x row. */
static int linear_rows_avx2(const Matrix *w, const float *x, int64_t m, int64_t r0, int64_t r1,
                            const void *bias, void *out, int bf16) {
    float *xp = malloc((size_t)(m * w->kp + 1) * sizeof(float)), *y = malloc((size_t)(m + 1) * sizeof(float));
    float *acc = malloc((size_t)(m + 1) * 8 * sizeof(float));
    int err = xp && y && acc ? OK : ERR_MEMORY;
    for (int64_t i = 0; i < m && err == OK; i++)
        for (int64_t g = 0; g < w->kp; g += HALF)
            for (int t = 0; t < HALF; t++) {
                int64_t col = g + LANE_ORDER[t];
                xp[i * w->kp + g + t] = col < w->k ? x[i * w->k + col] : 0.0f;
            }
    int64_t e = exc_lower_bound(w, r0 * w->k);
    for (int64_t r = r0; r < r1 && err == OK; r++) {
        dot_row_avx2(w, r, xp, m, acc, y);
        err = correct_row(w, r, x, m, y, &e);
        for (int64_t i = 0; i < m; i++) store_out(out, bf16, i * w->n + r, y[i] + bias_at(bias, bf16, r));
    }
    free(xp);
    free(y);
    free(acc);
    return err;
}
#endif

/* Rows idx[0..count) (int64; negative counts from the end, as torch indexing) as bf16 bits into
 * out [count, k]: an embedding lookup. */
static int lookup_rows(const Matrix *w, const int64_t *idx, int64_t count, uint16_t *out) {
    uint16_t *row = malloc((size_t)w->kp * sizeof(uint16_t) + 2);
    if (!row) return ERR_MEMORY;
    int err = OK;
    for (int64_t i = 0; i < count && err == OK; i++) {
        int64_t r = idx[i] < 0 ? idx[i] + w->n : idx[i];
        if (r < 0 || r >= w->n) {
            err = ERR_INDEX;
            break;
        }
        int64_t e = exc_lower_bound(w, r * w->k);
        err = decode_row(w, r, row, &e);
        memcpy(out + i * w->k, row, (size_t)w->k * sizeof(uint16_t));
    }
    free(row);
    return err;
}

/* out[i, r] = x[i] . W[r] (+ bias[r]) for rows r in [r0, r1), i < m. x [m, k], bias [n] (or NULL) and
 * out [m, n] are all fp32 (bf16 = 0) or all bf16 bits (bf16 = 1); sums in fp32, rounded once. */
static int linear_rows(const Matrix *w, const void *xin, int64_t m, int64_t r0, int64_t r1, const void *bias,
                       void *out, int bf16) {
    float *xs = NULL;
    const float *x = (const float *)xin;
    if (bf16) {
        xs = malloc((size_t)(m * w->k + 1) * sizeof(float));
        if (!xs) return ERR_MEMORY;
        for (int64_t i = 0; i < m * w->k; i++) xs[i] = bf16_to_f32(((const uint16_t *)xin)[i]);
        x = xs;
    }
    int err;
#ifdef GLYD_X86
    if (have_avx2()) err = linear_rows_avx2(w, x, m, r0, r1, bias, out, bf16); else
#endif
    err = linear_rows_portable(w, x, m, r0, r1, bias, out, bf16);
    free(xs);
    return err;
}

/* ---- Python face: pointers travel as integers (tensor.data_ptr()), checked by the launcher ---- */

static int parse_matrix(PyObject *t, Matrix *w, int *base) {
    unsigned long long lo, code, idx, hi;
    if (!PyArg_ParseTuple(t, "KKKiKLLLLi", &lo, &code, &idx, &w->idx64, &hi, &w->nexc, &w->n, &w->k, &w->kp, base))
        return -1;
    w->lo = (const uint8_t *)(uintptr_t)lo;
    w->code = (const uint8_t *)(uintptr_t)code;
    w->exc_idx = (const void *)(uintptr_t)idx;
    w->exc_hi = (const uint8_t *)(uintptr_t)hi;
    if (w->n < 0 || w->k < 0 || w->kp < w->k || w->kp % GROUP || w->nexc < 0) {
        PyErr_SetString(PyExc_ValueError, "fixed12 matrix description out of range");
        return -1;
    }
    return 0;
}

static PyObject *py_unpack(PyObject *self, PyObject *args) {
    PyObject *mt;
    long long r0, r1;
    unsigned long long out;
    Matrix w;
    int base, err;
    if (!PyArg_ParseTuple(args, "O!LLK", &PyTuple_Type, &mt, &r0, &r1, &out) || parse_matrix(mt, &w, &base) < 0)
        return NULL;
    if (r0 < 0 || r1 < r0 || r1 > w.n) {
        PyErr_SetString(PyExc_ValueError, "row range out of the matrix");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    err = matrix_init(&w, base);
    if (err == OK) err = unpack_rows(&w, r0, r1, (uint16_t *)(uintptr_t)out);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(err);
}

static PyObject *py_linear(PyObject *self, PyObject *args) {
    PyObject *mt;
    long long m, r0, r1;
    unsigned long long x, bias, out;
    int bf16, base, err;
    Matrix w;
    if (!PyArg_ParseTuple(args, "O!KLLLKKi", &PyTuple_Type, &mt, &x, &m, &r0, &r1, &bias, &out, &bf16) ||
        parse_matrix(mt, &w, &base) < 0)
        return NULL;
    if (m < 0 || r0 < 0 || r1 < r0 || r1 > w.n) {
        PyErr_SetString(PyExc_ValueError, "rows of x or of the matrix out of range");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    err = matrix_init(&w, base);
    if (err == OK)
        err = linear_rows(&w, (const void *)(uintptr_t)x, m, r0, r1, (const void *)(uintptr_t)bias,
                          (void *)(uintptr_t)out, bf16);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(err);
}

static PyObject *py_rows(PyObject *self, PyObject *args) {
    PyObject *mt;
    long long count;
    unsigned long long idx, out;
    Matrix w;
    int base, err;
    if (!PyArg_ParseTuple(args, "O!KLK", &PyTuple_Type, &mt, &idx, &count, &out) || parse_matrix(mt, &w, &base) < 0)
        return NULL;
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "negative count of rows");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    err = matrix_init(&w, base);
    if (err == OK) err = lookup_rows(&w, (const int64_t *)(uintptr_t)idx, count, (uint16_t *)(uintptr_t)out);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(err);
}

/* 0 when exc_idx is strictly increasing and inside [0, n*k), else ERR_ORDER / ERR_RANGE. */
static PyObject *py_check(PyObject *self, PyObject *args) {
    PyObject *mt;
    Matrix w;
    int base, err = OK;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &mt) || parse_matrix(mt, &w, &base) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    err = base < 0 || base > MAX_BASE ? ERR_BASE : OK;
    for (int64_t e = 0; e < w.nexc && err == OK; e++) {
        int64_t v = exc_at(&w, e);
        if (v < 0 || v >= w.n * w.k) err = ERR_RANGE;
        else if (e && v <= exc_at(&w, e - 1)) err = ERR_ORDER;
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(err);
}

static PyObject *py_simd(PyObject *self, PyObject *args) {
    return PyUnicode_FromString(have_avx2() ? "avx2" : "portable");
}

static PyObject *py_set_portable(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    forced = on ? 0 : -1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"unpack", py_unpack, METH_VARARGS, "unpack(matrix, r0, r1, out_ptr) -> error code"},
    {"linear", py_linear, METH_VARARGS,
     "linear(matrix, x_ptr, m, r0, r1, bias_ptr, out_ptr, bf16) -> error code"},
    {"rows", py_rows, METH_VARARGS, "rows(matrix, idx_ptr, count, out_ptr) -> error code"},
    {"check", py_check, METH_VARARGS, "check(matrix) -> error code"},
    {"simd", py_simd, METH_NOARGS, "the instruction set the kernels use: avx2 or portable"},
    {"set_portable", py_set_portable, METH_VARARGS, "set_portable(on): run the portable loops even where AVX2 is"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "glyd.kernels.fixed12._cpu", "glyd's fixed12 CPU kernels", -1, methods};

PyMODINIT_FUNC PyInit__cpu(void) { return PyModule_Create(&module); }

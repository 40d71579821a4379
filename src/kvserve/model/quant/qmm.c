/* y = x @ W.T straight from GGUF block bytes (kvserve.model.quant._qmm).
 *
 * The arithmetic is llama.cpp's CPU backend's: each row of x is quantized per block to the
 * weight format's activation type (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the
 * K-quants); each block's dot product of weight codes and activation codes is an exact int32,
 * scaled by the blocks' scales and accumulated over the blocks of a row in order, in float32.
 * Every y[m, n] is computed by the same operations in the same order whatever M, the tiling, the
 * thread count or the instruction set (scalar, AVX2, AVX-512 VNNI, AMX): qmm_scalar.c's functions
 * are the reference, the SIMD ones compute the same integers and the same float operations
 * (Q4_1 and Q8_0 never take the AMX tiles: a tile's dot sums 64 codes, the lanes need 4).
 *
 * Per block (dx, mx, dmin: the weight block's f16 fields; dy, sy, bs: the activation block's):
 *   Q4_1, Q8_0         ggml's x86 vec_dot (ggml_vec_dot_q4_1_q8_1, _q8_0_q8_0; the kernels
 *                      llama.cpp's CPU backend runs for these formats on an AVX2 / AVX-512
 *                      machine, for one row and for prompt batches alike: no repacking, no
 *                      llamafile sgemm for Q4_1; Q8_0's sgemm only takes batches of ≥ 2 rows,
 *                      and the output head sees one row per sequence): 8 float lanes, lane j =
 *                      Σ c·q over codes 4j..4j+3 (c signed for Q8_0), acc_j = fma(dx·dy, lane_j,
 *                      acc_j); Q4_1: summs = fma(mx, sy, summs); y = hsum_float_8(acc) (+ summs),
 *                      hsum = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))
 *   Q4_0, Q5_0         s = Σ c·q − z·Σq (z = 8, 16; c the unsigned code)     acc = fma(dx·dy, s, acc)
 *   Q5_1               s = Σ c·q           acc = fma(dx·dy, s, acc); acc = fma(mx, sy, acc)
 *   Q4_K, Q5_K         s = Σ_j sc_j Σ c·q, t = Σ_j mn_j (bs_2j + bs_2j+1)
 *                      acc = fma(dx·dy, s, acc); acc = fma(−dmin·dy, t, acc)
 *   Q6_K               s = Σ_j sc_j (Σ c·q − 32·bs_j)                        acc = fma(dx·dy, s, acc)
 * (integers converted to float32 once, round to nearest even).
 *
 * Threads: one OpenMP parallel region per call (libgomp by soname: torch's runtime when torch is
 * loaded first), columns split in fixed chunks; rows are never split, so nothing depends on it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "qmm.h"

static int best_isa(void) {
#ifdef QMM_X86
    static int amx = -1;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        if (amx < 0) amx = amx_usable();
        return amx ? ISA_AMX : ISA_AVX512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return ISA_AVX2;
#endif
    return ISA_SCALAR;
}

#define COL_CHUNK 16

/* y[m, n] (row stride ldy) for rows [0, M), columns [0, N) */
static void qmm(int fmt, const float *x, int64_t M, int64_t K, const uint8_t *W, int64_t N, float *y, int64_t ldy,
                int nthreads, int isa) {
    const int at = ACT_OF[fmt];
    const int64_t bw = at == A_Q8_K ? 256 : 32, nb = K / bw, rb = nb * BLOCK_BYTES[fmt];
    const size_t abytes = at == A_Q8_K ? sizeof(actK) : sizeof(act32);
    const size_t xbytes = at == A_Q8_K ? sizeof(actKx16) : sizeof(act32x16);
    const int64_t groups = isa >= ISA_AVX512 ? M / 16 : 0;
    void *act = aligned_alloc(64, ((size_t)(M * nb * abytes) + 63) / 64 * 64 + 64);
    void *actx = groups ? aligned_alloc(64, (size_t)(groups * nb) * xbytes + 64) : NULL;
    const int64_t nchunks = (N + COL_CHUNK - 1) / COL_CHUNK;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > 1 && M * K * N < (1 << 16)) nthreads = 1;
#pragma omp parallel num_threads(nthreads)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) quantize_rows(at, x, m, m + 1, K, act, isa);
        if (groups) {
#pragma omp for schedule(static)
            for (int64_t gb = 0; gb < groups * nb; gb++) {
                const int64_t g = gb / nb, b = gb % nb;
                if (at == A_Q8_K)
                    interleave_K((const actK *)act + 16 * g * nb, nb, b, (actKx16 *)actx + gb);
                else
                    interleave_32((const act32 *)act + 16 * g * nb, nb, b, (act32x16 *)actx + gb);
            }
        }
#pragma omp for schedule(static) /* contiguous columns per thread: the prefetches run ahead in them */
        for (int64_t ch = 0; ch < nchunks; ch++) {
            const int64_t n0 = ch * COL_CHUNK, n1 = n0 + COL_CHUNK < N ? n0 + COL_CHUNK : N;
            const int64_t mrest = 16 * groups;
#ifdef QMM_X86
            if (isa == ISA_AMX) {
                if (groups && lane_fmt(fmt)) tile_512_rows(fmt, W, rb, n0, n1, actx, 0, groups, K, y, ldy);
                else if (groups) tile_amx_rows(fmt, W, rb, n0, n1, actx, 0, groups, K, y, ldy);
                if (mrest < M) tile_512_cols(fmt, W, rb, n0, n1, act, mrest, M, K, y, ldy);
            } else if (isa >= ISA_AVX512) {
                if (groups) tile_512_rows(fmt, W, rb, n0, n1, actx, 0, groups, K, y, ldy);
                if (mrest < M) tile_512_cols(fmt, W, rb, n0, n1, act, mrest, M, K, y, ldy);
            } else if (isa == ISA_AVX2) {
                tile_avx2(fmt, W, rb, n0, n1, act, 0, M, K, y, ldy);
            } else
#endif
                tile_scalar(fmt, W, rb, n0, n1, act, 0, M, K, y, ldy);
        }
    }
    free(act);
    free(actx);
}

/* ---- Python ---- */

static PyObject *py_matmul(PyObject *self, PyObject *args) {
    int fmt, nthreads, isa;
    unsigned long long xp, wp, yp;
    long long M, K, N, ldy;
    if (!PyArg_ParseTuple(args, "iKLLKLKLii", &fmt, &xp, &M, &K, &wp, &N, &yp, &ldy, &nthreads, &isa)) return NULL;
    if (fmt < 0 || fmt >= F_COUNT || K % BLOCK_W[fmt] || M < 0 || N < 0) {
        PyErr_SetString(PyExc_ValueError, "qmm.matmul: bad format or shape");
        return NULL;
    }
    const int best = best_isa();
    if (isa < 0 || isa > best) isa = best;
    Py_BEGIN_ALLOW_THREADS
    qmm(fmt, (const float *)xp, M, K, (const uint8_t *)wp, N, (float *)yp, ldy, nthreads, isa);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_best_isa(PyObject *self, PyObject *args) { return PyLong_FromLong(best_isa()); }

static PyObject *py_quantize(PyObject *self, PyObject *args) {
    /* the activation blocks of x (for tests): Q8_0/Q8_1 → act32 rows, Q8_K → actK rows */
    int fmt, isa = -1;
    unsigned long long xp, op;
    long long M, K;
    if (!PyArg_ParseTuple(args, "iKLLK|i", &fmt, &xp, &M, &K, &op, &isa)) return NULL;
    if (fmt < 0 || fmt >= F_COUNT || K % BLOCK_W[fmt]) {
        PyErr_SetString(PyExc_ValueError, "qmm.quantize: bad format or shape");
        return NULL;
    }
    const int best = best_isa();
    if (isa < 0 || isa > best) isa = best;
    quantize_rows(ACT_OF[fmt], (const float *)xp, 0, M, K, (void *)op, isa);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"matmul", py_matmul, METH_VARARGS,
     "matmul(fmt, x_ptr, M, K, w_ptr, N, y_ptr, ldy, nthreads, isa): y[:, :N] = x @ W.T (float32)"},
    {"best_isa", py_best_isa, METH_NOARGS, "0 scalar, 1 AVX2, 2 AVX-512 VNNI, 3 AMX int8: the best this CPU runs"},
    {"quantize", py_quantize, METH_VARARGS, "quantize(fmt, x_ptr, M, K, out_ptr[, isa]): activation blocks (tests)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_qmm", NULL, -1, methods};

PyMODINIT_FUNC PyInit__qmm(void) { return PyModule_Create(&module); }

/* The CPU layer's elementwise work as native calls (kvserve.model._ops_cpu): RMSNorm with the
 * residual add before it, RoPE on q and k with the KV write into the paged pool (QK-norm first
 * where the architecture has it), and the gated MLP's act(gate) · up.
 *
 * Arithmetic (llama.cpp's CPU backend's where it is cheap):
 *   RMSNorm   h = x + r (float32, stored: into r itself where the caller's stream allows); Σ h² with each square rounded to float32
 *             and summed in float64 (eight interleaved accumulators combined pairwise, then the
 *             tail: a fixed order); mean = (float)(Σ / n); scale = 1 / sqrtf(mean + eps);
 *             y = (h · scale) · w — ggml's rms_norm fused with its weight multiply
 *   RoPE      from kvserve's per-position cos/sin tables (rope_table below: ggml's rope cache,
 *             float32 angles by repeated products, libm's cosf/sinf): a pair (x0, x1) becomes
 *             (fma(x0, c, −(x1·s)), fma(x0, s, x1·c)), ggml's rotation as its build contracts
 *             it (the torch reference rope.apply_rope evaluates the same in float64); pairs are
 *             adjacent ("norm") or half a head apart ("neox"); dims past the rope dims are left
 *             as they are
 *   SiLU      ggml_vec_swiglu_f32: (g / (1 + expf(0 − g))) · u with ggml's AVX-512 ggml_v_expf
 *             for a row's 16-element blocks and libm's expf for the tail (ggml_expf below: the
 *             same float operations in every lane and at every instruction-set level)
 *   GELU-tanh ggml's table: gelu(f16(g)) rounded to f16 (0 for g ≤ −10, g for g ≥ 10), · u
 *   KV write  float32 → float16 / bfloat16 rounded to nearest even (as torch's conversion)
 *   bias      the fused projection's bias added first (x + b, as the linear layer adds it)
 * Every output row depends only on its own input row: the same bits whatever the number of
 * rows, the order, the thread count (rows are split between OpenMP threads, never a row).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "quant/qmm.h" /* f32_to_f16, f16_to_f32 */

/* ---- RMSNorm ---- */

static inline float norm_scale(const float *h, int64_t n, float eps) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            const float p = h[i + j] * h[i + j];
            acc[j] += (double)p;
        }
    double sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) {
        const float p = h[i] * h[i];
        sum += (double)p;
    }
    const float mean = (float)(sum / (double)n);
    return 1.0f / sqrtf(mean + eps);
}

/* y = norm(h) · w, in place allowed (y == h) */
static inline void norm_row(const float *h, const float *w, float *y, int64_t n, float eps) {
    const float scale = norm_scale(h, n, eps);
    for (int64_t i = 0; i < n; i++) y[i] = (h[i] * scale) * w[i];
}

/* with r: s = x + r (s may be r itself), y = norm(s) · w; else y = norm(x) · w */
static inline void add_norm_row(const float *x, const float *r, float *s, const float *w, float *y, int64_t n,
                                float eps) {
    if (r) {
        for (int64_t i = 0; i < n; i++) s[i] = x[i] + r[i];
        x = s;
    }
    norm_row(x, w, y, n, eps);
}

/* rows [0, M) split between threads (one thread for a few rows: no parallel region at all) */
#define FOR_ROWS(M, nthreads, min_rows, body)                                   \
    if ((nthreads) <= 1 || (M) < (min_rows)) {                                  \
        for (int64_t m = 0; m < (M); m++) body;                                 \
    } else {                                                                    \
        _Pragma("omp parallel for num_threads(nthreads) schedule(static)")      \
        for (int64_t m = 0; m < (M); m++) body;                                 \
    }

static void rms_norm(const float *x, int64_t ldx, const float *r, int64_t ldr, float *s, int64_t lds,
                     const float *w, float *y, int64_t ldy, int64_t M, int64_t N, float eps, int nthreads) {
    FOR_ROWS(M, nthreads, 16,
             add_norm_row(x + m * ldx, r ? r + m * ldr : NULL, s + m * lds, w, y + m * ldy, N, eps))
}

/* ---- exp and the activations ---- */

static uint16_t GELU_F16[1 << 16]; /* gelu(f16 x) rounded to f16, ggml's table */
static int gelu_ready = 0;

static void gelu_table(void) {
    for (int i = 0; i < (1 << 16); i++) {
        const float x = f16_to_f32((uint16_t)i);
        const float g = 0.5f * x * (1.0f + tanhf(0.79788456080286535587989211986876f * x * (1.0f + 0.044715f * x * x)));
        GELU_F16[i] = f32_to_f16(g);
    }
    gelu_ready = 1;
}

/* ggml's AVX-512 ggml_v_expf (the one llama.cpp's CPU backend runs on an AVX-512 machine), one
 * lane of it: n = round(x·log2 e) by the 1.5·2^23 shift, b = x − n·ln 2 in two fnmadds, a degree-5
 * polynomial in b (its own coefficients, fma-evaluated in its order), scaled by 2^n (scalef:
 * one rounding; here two exact power-of-two factors, the second rounding once), 0 or inf where
 * |n| > 192. FMA is fmaf (libm) or the instruction: the same bits. */
#define GGML_EXPF(NAME, FMA)                                                                 \
    static inline float NAME(float x) {                                                      \
        const float z = FMA(x, 0x1.715476p+0f, 0x1.8p23f), n = z - 0x1.8p23f;                 \
        const float b = FMA(-n, 0x1.7f7d1cp-20f, FMA(-n, 0x1.62e4p-1f, x));                  \
        const float u = b * b;                                                               \
        const float j = FMA(FMA(FMA(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, FMA(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), \
                            u, FMA(0x1.ffffecp-1f, b, 1.0f));                                \
        const float nc = n > 192.f ? 192.f : (n < -192.f ? -192.f : n); /* no branches: vectorizes */ \
        const int32_t ni = (int32_t)(nc == nc ? nc : 0.f), ea = ni / 2, eb = ni - ea;        \
        const int32_t ba = (ea + 127) << 23, bb = (eb + 127) << 23;                           \
        float fa, fb;                                                                        \
        memcpy(&fa, &ba, 4);                                                                 \
        memcpy(&fb, &bb, 4);                                                                 \
        const float res = (j * fa) * fb;                                                     \
        const float alt = n > 0.f ? INFINITY : 0.f;                                          \
        return n != n ? n : (fabsf(n) <= 192.f ? res : alt);                                 \
    }

/* ggml_vec_swiglu_f32: y = silu(g) · u with silu(g) = g / (1 + expf(0 − g)), ggml_v_expf for
 * the 16-lane blocks of a row and libm's expf for the tail past them (as ggml's loop) */
#define SILU_BODY(EXPF)                                                                      \
    const int64_t nv = n - n % 16;                                                           \
    for (int64_t i = 0; i < nv; i++) y[i] = (g[i] / (1.0f + EXPF(0.0f - g[i]))) * u[i];     \
    for (int64_t i = nv; i < n; i++) y[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];

GGML_EXPF(ggml_expf_generic, fmaf)
static void silu_row_generic(const float *g, const float *u, float *y, int64_t n) { SILU_BODY(ggml_expf_generic) }
#ifdef QMM_X86
T_AVX2 GGML_EXPF(ggml_expf_avx2, __builtin_fmaf)
T_AVX512 GGML_EXPF(ggml_expf_avx512, __builtin_fmaf)
T_AVX2 static void silu_row_avx2(const float *g, const float *u, float *y, int64_t n) { SILU_BODY(ggml_expf_avx2) }
T_AVX512 static void silu_row_avx512(const float *g, const float *u, float *y, int64_t n) { SILU_BODY(ggml_expf_avx512) }
#endif

static int ISA = -1; /* 0 generic, 1 AVX2, 2 AVX-512: the SiLU and RoPE loops' instruction set */

static void silu_row(const float *g, const float *u, float *y, int64_t n) {
#ifdef QMM_X86
    if (ISA == 2) return silu_row_avx512(g, u, y, n);
    if (ISA == 1) return silu_row_avx2(g, u, y, n);
#endif
    silu_row_generic(g, u, y, n);
}

static void gelu_row(const float *g, const float *u, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        float a;
        if (x <= -10.0f) {
            y[i] = 0.0f;
            continue;
        }
        a = x >= 10.0f ? x : f16_to_f32(GELU_F16[f32_to_f16(x)]);
        y[i] = a * u[i];
    }
}

/* y[m, :n] = act(g[m, :n]) · u[m, :n] (rows ldg, ldu, ldy apart; g and u may be one fused row) */
static void act_mul(const float *g, int64_t ldg, const float *u, int64_t ldu, int64_t n, float *y, int64_t ldy,
                    int64_t M, int act, int nthreads) {
    if (act) {
        FOR_ROWS(M, nthreads, 4, gelu_row(g + m * ldg, u + m * ldu, y + m * ldy, n))
    } else {
        FOR_ROWS(M, nthreads, 4, silu_row(g + m * ldg, u + m * ldu, y + m * ldy, n))
    }
}

/* ---- RoPE, QK-norm and the KV write ---- */

enum { KV_F32, KV_F16, KV_BF16 };

static inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((x >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

static inline void store_row(void *dst, int kvtype, const float *x, int64_t n) {
    if (kvtype == KV_F32) {
        memcpy(dst, x, (size_t)n * 4);
    } else if (kvtype == KV_F16) {
        uint16_t *d = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++) d[i] = f32_to_f16(x[i]);
    } else {
        uint16_t *d = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(x[i]);
    }
}

/* ggml's rotation of a pair, contracted as its build contracts it (gcc, -ffp-contract=fast):
 * x0' = fma(x0, c, −(x1·s)), x1' = fma(x0, s, x1·c) */
#define ROTATE_BODY(FMA)                                                      \
    const int64_t h = rd / 2;                                                 \
    if (neox) {                                                               \
        for (int64_t i = 0; i < h; i++) {                                     \
            const float x0 = x[i], x1 = x[i + h];                             \
            x[i] = FMA(x0, c[i], -(x1 * s[i]));                               \
            x[i + h] = FMA(x0, s[i], x1 * c[i]);                              \
        }                                                                     \
    } else {                                                                  \
        for (int64_t i = 0; i < h; i++) {                                     \
            const float x0 = x[2 * i], x1 = x[2 * i + 1];                     \
            x[2 * i] = FMA(x0, c[i], -(x1 * s[i]));                           \
            x[2 * i + 1] = FMA(x0, s[i], x1 * c[i]);                          \
        }                                                                     \
    }

static void rotate_generic(float *x, const float *c, const float *s, int64_t rd, int neox) { ROTATE_BODY(fmaf) }
#ifdef QMM_X86
T_AVX2 static void rotate_avx2(float *x, const float *c, const float *s, int64_t rd, int neox) {
    ROTATE_BODY(__builtin_fmaf)
}
#endif

static inline void rotate(float *x, const float *c, const float *s, int64_t rd, int neox) {
#ifdef QMM_X86
    if (ISA >= 1) return rotate_avx2(x, c, s, rd, neox);
#endif
    rotate_generic(x, c, s, rd, neox);
}

/* cos/sin [n_pos, rd / 2] of positions [p0, p0 + n_pos) as ggml's rope cache computes them:
 * θ_0 = p, θ_i+1 = θ_i · powf(base, −2 / rd) (float32 products, in order), then
 * cosf(freq_scale · θ_i), sinf(freq_scale · θ_i) (libm's; attn_factor 1, no YaRN) */
static void rope_table(float *cs, float *sn, int64_t p0, int64_t n_pos, int64_t rd, float base, float freq_scale) {
    const float theta_scale = powf(base, -2.0f / (float)rd);
    const int64_t h = rd / 2;
    for (int64_t p = 0; p < n_pos; p++) {
        float theta = (float)(p0 + p);
        for (int64_t i = 0; i < h; i++) {
            const float t = freq_scale * theta;
            cs[p * h + i] = cosf(t);
            sn[p * h + i] = sinf(t);
            theta *= theta_scale;
        }
    }
}

typedef struct {
    float *qkv;
    int64_t T, ld, H, Hkv, D, rd;
    const float *cos, *sin; /* [positions, rd / 2] */
    const int64_t *pos, *rows;
    char *k, *v; /* the layer's K and V rows: [rows, Hkv, D] each */
    int kvtype, neox;
    const float *qw, *kw; /* QK-norm weights [D] or NULL */
    float eps;
    const float *bias; /* the projection's bias [(H + 2 Hkv) D], added first, or NULL */
} rope_args;

static void rope_kv_row(const rope_args *a, int64_t t) {
    const int64_t hd = a->D, row_bytes = a->Hkv * hd * (a->kvtype == KV_F32 ? 4 : 2);
    float *x = a->qkv + t * a->ld;
    if (a->bias)
        for (int64_t i = 0; i < (a->H + 2 * a->Hkv) * hd; i++) x[i] = x[i] + a->bias[i];
    const float *c = a->cos + a->pos[t] * (a->rd / 2), *s = a->sin + a->pos[t] * (a->rd / 2);
    for (int64_t h = 0; h < a->H + a->Hkv; h++) {
        float *xh = x + h * hd;
        const float *w = h < a->H ? a->qw : a->kw;
        if (w) norm_row(xh, w, xh, hd, a->eps);
        rotate(xh, c, s, a->rd, a->neox);
    }
    const int64_t r = a->rows[t];
    store_row(a->k + r * row_bytes, a->kvtype, x + a->H * hd, a->Hkv * hd);
    store_row(a->v + r * row_bytes, a->kvtype, x + (a->H + a->Hkv) * hd, a->Hkv * hd);
}

static void rope_kv(const rope_args *a, int nthreads) { FOR_ROWS(a->T, nthreads, 8, rope_kv_row(a, m)) }

/* ---- Python (METH_FASTCALL: pointers and sizes as ints, floats as floats) ---- */

static int ints(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, int64_t *out, const char *name) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s: %zd arguments, want %zd", name, nargs, want);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (PyFloat_Check(args[i])) {
            double d = PyFloat_AsDouble(args[i]);
            memcpy(&out[i], &d, 8);
            continue;
        }
        out[i] = (int64_t)PyLong_AsLongLong(args[i]);
        if (out[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

static inline float flt(int64_t bits) {
    double d;
    memcpy(&d, &bits, 8);
    return (float)d;
}

#define PTR(T, v) ((T *)(uintptr_t)(v))

static PyObject *py_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* rms_norm(x, ldx, r, ldr, s, lds, w, y, ldy, M, N, eps, nthreads); r = 0: no residual */
    int64_t a[13];
    if (ints(args, nargs, 13, a, "rms_norm")) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rms_norm(PTR(const float, a[0]), a[1], PTR(const float, a[2]), a[3], PTR(float, a[4]), a[5],
             PTR(const float, a[6]), PTR(float, a[7]), a[8], a[9], a[10], flt(a[11]), (int)a[12]);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_act_mul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* act_mul(g, ldg, u, ldu, n, y, ldy, M, act (0 silu, 1 gelu_tanh), nthreads) */
    int64_t a[10];
    if (ints(args, nargs, 10, a, "act_mul")) return NULL;
    if (a[8] && !gelu_ready) gelu_table();
    Py_BEGIN_ALLOW_THREADS
    act_mul(PTR(const float, a[0]), a[1], PTR(const float, a[2]), a[3], a[4], PTR(float, a[5]), a[6], a[7],
            (int)a[8], (int)a[9]);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_rope_kv(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* rope_kv(qkv, T, ld, H, Hkv, D, rd, cos, sin, pos, rows, k, v, kvtype, neox, qw, kw, eps, nthreads, bias) */
    int64_t a[20];
    if (ints(args, nargs, 20, a, "rope_kv")) return NULL;
    if (a[13] < KV_F32 || a[13] > KV_BF16 || a[6] > a[5] || a[6] % 2) {
        PyErr_SetString(PyExc_ValueError, "rope_kv: bad KV type or rope dims");
        return NULL;
    }
    rope_args r = {PTR(float, a[0]), a[1], a[2], a[3], a[4], a[5], a[6], PTR(const float, a[7]),
                   PTR(const float, a[8]), PTR(const int64_t, a[9]), PTR(const int64_t, a[10]), PTR(char, a[11]),
                   PTR(char, a[12]), (int)a[13], (int)a[14], PTR(const float, a[15]), PTR(const float, a[16]),
                   flt(a[17]), PTR(const float, a[19])};
    Py_BEGIN_ALLOW_THREADS
    rope_kv(&r, (int)a[18]);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_rope_table(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* rope_table(cos, sin, p0, n_pos, rd, base, freq_scale): ggml's cos/sin per position */
    int64_t a[7];
    if (ints(args, nargs, 7, a, "rope_table")) return NULL;
    if (a[4] < 2 || a[4] % 2 || a[3] < 0) {
        PyErr_SetString(PyExc_ValueError, "rope_table: bad rope dims or count");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rope_table(PTR(float, a[0]), PTR(float, a[1]), a[2], a[3], a[4], flt(a[5]), flt(a[6]));
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_exp(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* exp(x, y, n): y = ggml_v_expf(x) elementwise (tests) */
    int64_t a[3];
    if (ints(args, nargs, 3, a, "exp")) return NULL;
    const float *x = PTR(const float, a[0]);
    float *y = PTR(float, a[1]);
    for (int64_t i = 0; i < a[2]; i++) y[i] = ggml_expf_generic(x[i]);
    Py_RETURN_NONE;
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg) {
    /* set_isa(level): cap the SiLU loop's instruction set (0 generic, 1 AVX2, 2 AVX-512); returns it */
    long want = PyLong_AsLong(arg);
    if (want == -1 && PyErr_Occurred()) return NULL;
    int best = 0;
#ifdef QMM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) best = 1;
    if (best && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni"))
        best = 2;
#endif
    ISA = want < 0 || want > best ? best : (int)want;
    return PyLong_FromLong(ISA);
}

static PyMethodDef methods[] = {
    {"rms_norm", (PyCFunction)(void (*)(void))py_rms_norm, METH_FASTCALL,
     "rms_norm(x, ldx, r, ldr, s, lds, w, y, ldy, M, N, eps, nthreads): s = x + r (r != 0); y = norm(s or x) * w"},
    {"act_mul", (PyCFunction)(void (*)(void))py_act_mul, METH_FASTCALL,
     "act_mul(g, ldg, u, ldu, n, y, ldy, M, act, nthreads): y = act(g) * u, rows of n"},
    {"rope_kv", (PyCFunction)(void (*)(void))py_rope_kv, METH_FASTCALL,
     "rope_kv(qkv, T, ld, H, Hkv, D, rd, cos, sin, pos, rows, k, v, kvtype, neox, qw, kw, eps, nthreads, bias)"},
    {"rope_table", (PyCFunction)(void (*)(void))py_rope_table, METH_FASTCALL,
     "rope_table(cos, sin, p0, n_pos, rd, base, freq_scale): ggml's rope cos/sin [n_pos, rd / 2]"},
    {"exp", (PyCFunction)(void (*)(void))py_exp, METH_FASTCALL, "exp(x, y, n): the kernels' exp (tests)"},
    {"set_isa", py_set_isa, METH_O, "set_isa(level): cap the instruction set (-1: the best); returns it"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ops_cpu", NULL, -1, methods};

PyMODINIT_FUNC PyInit__ops_cpu(void) {
    PyObject *m = PyModule_Create(&module);
    if (m) {
        PyObject *best = PyLong_FromLong(-1), *r = best ? py_set_isa(m, best) : NULL;
        Py_XDECREF(best);
        Py_XDECREF(r);
        if (!r) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}

/* Attention over the paged KV pool on the CPU, one call per layer (kvserve.model._attn).
 *
 * The arithmetic is llama.cpp's CPU flash attention for a row of queries at a time
 * (ggml_compute_forward_flash_attn_ext_f16_one_chunk, the path llama-server takes for decode and
 * for prompts of fewer than 64 tokens), on an x86 build with AVX-512:
 *
 *   for each query row and head:  q' = q rounded to the K cache's type (float16 or float32)
 *     for each visible key j in position order:
 *       s = dot(q', k_j) * scale            (the dot: 4 accumulators of 16 lanes over D in steps
 *                                            of 64, fused multiply-adds, summed (a0+a2)+(a1+a3),
 *                                            the lanes in _mm512_reduce_add_ps's tree; leftovers
 *                                            in double)
 *       softcap: s = c * tanhf(s / c)
 *       if s > M: ms = expf(M - s), M = s, acc = acc * ms, vs = 1   else vs = expf(s - M), ms = 1
 *       acc = fma(v_j, vs, acc)             (acc in the V cache's type: float16 rounds every step)
 *       S = fma(S, ms, vs)
 *     out = acc * (1 / S)
 *
 * A row's output depends on nothing but its own query and keys, walked in the same order whatever
 * the batch (prefill chunk, cached prefix, decode batch of any width), the thread count or the
 * instruction set: scalar and AVX-512 functions compute the same operations, so cached and uncached
 * evaluations, batch widths and chunkings give the same bits.
 *
 * Keys: position p of a sequence lies in cache row table[p / page_size] * page_size + p % page_size;
 * query row t (position pos) sees positions [max(0, pos - window + 1), pos] (window 0: [0, pos]).
 * Threads: one OpenMP region per call, (row, head) items shared out dynamically.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#define ATTN_X86 1
#include <immintrin.h>
#endif

/* ---- float16 <-> float32, round to nearest even (what F16C does) ---- */

static inline float h2f(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    uint32_t bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) {
        if (m == 0) {
            bits = sign;
        } else { /* subnormal: m * 2^-24, exact in float32 */
            float f = (float)m * 0x1p-24f;
            memcpy(&bits, &f, 4);
            bits |= sign;
        }
    } else {
        bits = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0); /* inf, nan */
    if (ax >= 0x477ff000u) return sign | 0x7c00;                                   /* rounds to inf */
    if (ax < 0x38800000u) { /* result subnormal or zero: round ax * 2^24 to an integer */
        float a;
        memcpy(&a, &ax, 4);
        const float r = a * 0x1p24f; /* exact (a power of two) */
        /* round half to even of r (< 1024) */
        const float fl = floorf(r), d = r - fl;
        uint32_t m = (uint32_t)fl;
        if (d > 0.5f || (d == 0.5f && (m & 1))) m++;
        return sign | (uint16_t)m;
    }
    uint32_t m = ax + 0xc8000fffu + ((ax >> 13) & 1); /* rebias exponent by -112, round (RNE) */
    return sign | (uint16_t)(m >> 13);
}

static inline float r16(float f) { return h2f(f2h(f)); }

/* a double rounded to float16 once (round to nearest even) */
static inline float d2h_f(double x) {
    const double a = fabs(x);
    if (a >= 65520.0) return x < 0 ? -INFINITY : INFINITY;
    double r;
    if (a < 0x1p-14) { /* subnormal: a multiple of 2^-24 */
        r = nearbyint(a * 0x1p24) * 0x1p-24;
    } else {
        int e;
        frexp(a, &e); /* a in [2^(e-1), 2^e): 11 significant bits */
        r = ldexp(nearbyint(ldexp(a, 11 - e)), e - 11);
    }
    return (float)(x < 0 ? -r : r);
}

/* float16 arithmetic of the accumulator (llama.cpp's AVX512-FP16 build, for head sizes >= 128):
 * acc = fma16(v, f16(vs), acc) and acc = acc * f16(ms), one float16 rounding each; the product
 * of two float16 values is exact in float32 and, beside a float16 addend of these magnitudes
 * (|v·vs| <= 65504), the sum is exact in double */
static inline float fma16(float v, float w16, float acc) { return d2h_f((double)v * (double)w16 + (double)acc); }

/* ---- one item: rows [t0, t0 + R) of one sequence and the G query heads of one kv head ---- */

#define MAX_CHAINS 32 /* R * G (row, head) pairs of an item */
#define MAX_ROWS 4
#define KB_MAX 32 /* keys per block (the AVX-512 functions) */

typedef struct {
    const float *q[MAX_CHAINS];   /* each pair's query, D floats */
    float *out[MAX_CHAINS];
    int64_t lo[MAX_CHAINS], hi[MAX_CHAINS]; /* each pair's key positions [lo, hi) */
    int n;                        /* pairs */
    int64_t lo_all, hi_all;       /* the union of their key ranges */
    const char *k, *v;            /* cache bases of this kv head: element (row r, d) at base + (r * rs + d) * es */
    int64_t rs;                   /* cache row stride in elements */
    const int64_t *table;
    int64_t ps;
} item;

typedef struct {
    int64_t D;
    int f16;     /* K and V float16 (else float32) */
    int64_t n16; /* float16 KV: the first n16 elements accumulate in float16 arithmetic (below) */
    int fp16;    /* ...with the CPU's float16 instructions (AVX512-FP16), else emulated */
    float scale, softcap;
} params;

static inline float ld(const char *base, int64_t i, int f16) {
    return f16 ? h2f(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

static inline float score(float s, const params *p) {
    s = s * p->scale;
    if (p->softcap != 0.0f) s = p->softcap * tanhf(s);
    return s;
}

/* the scalar reference: each pair on its own */

/* llama.cpp's ggml_vec_dot_f16 / ggml_vec_dot_f32 on AVX-512, element for element */
static float dot_ref(const float *q, const char *k, int f16, int64_t D) {
    float a[4][16] = {{0}};
    const int64_t np = D & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 16; l++) {
                const int64_t d = i + 16 * j + l;
                a[j][l] = fmaf(q[d], ld(k, d, f16), a[j][l]);
            }
    float x[16], t3[8], t6[4];
    for (int l = 0; l < 16; l++) x[l] = (a[0][l] + a[2][l]) + (a[1][l] + a[3][l]);
    for (int l = 0; l < 8; l++) t3[l] = x[l + 8] + x[l];
    for (int l = 0; l < 4; l++) t6[l] = t3[l + 4] + t3[l];
    float r = (t6[0] + t6[2]) + (t6[1] + t6[3]);
    if (np < D) {
        double s = r;
        for (int64_t d = np; d < D; d++) s += (double)(q[d] * ld(k, d, f16));
        r = (float)s;
    }
    return r;
}

static void pair_ref(const item *it, int c, const params *p, float *qb, float *acc) {
    const int64_t D = p->D;
    const size_t es = p->f16 ? 2 : 4;
    for (int64_t d = 0; d < D; d++) qb[d] = p->f16 ? r16(it->q[c][d]) : it->q[c][d];
    memset(acc, 0, D * sizeof(float));
    float M = -INFINITY, S = 0.0f;
    for (int64_t pos = it->lo[c]; pos < it->hi[c]; pos++) {
        const int64_t row = it->table[pos / it->ps] * it->ps + pos % it->ps;
        const char *kr = it->k + (size_t)(row * it->rs) * es, *vr = it->v + (size_t)(row * it->rs) * es;
        const float s = score(dot_ref(qb, kr, p->f16, D), p);
        float ms = 1.0f, vs = 1.0f;
        if (s > M) {
            ms = expf(M - s);
            M = s;
            const float m16 = r16(ms);
            for (int64_t d = 0; d < p->n16; d++) acc[d] = r16(acc[d] * m16);
            for (int64_t d = p->n16; d < D; d++) acc[d] = p->f16 ? r16(acc[d] * ms) : acc[d] * ms;
        } else {
            vs = expf(s - M);
        }
        const float w16 = r16(vs);
        for (int64_t d = 0; d < p->n16; d++) acc[d] = fma16(ld(vr, d, 1), w16, acc[d]);
        for (int64_t d = p->n16; d < D; d++) {
            const float y = fmaf(ld(vr, d, p->f16), vs, acc[d]);
            acc[d] = p->f16 ? r16(y) : y;
        }
        S = fmaf(S, ms, vs);
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int64_t d = 0; d < D; d++) it->out[c][d] = acc[d] * inv;
}

static void item_ref(const item *it, const params *p, float *buf) {
    for (int c = 0; c < it->n; c++) pair_ref(it, c, p, buf, buf + p->D);
}

/* ---- the same with AVX-512 (D a multiple of 64): the item's pairs walk the keys together, each
 * key row read and converted once, their independent accumulators overlapping ---- */

#ifdef ATTN_X86
#define T512 __attribute__((target("avx512f,avx512dq,fma,f16c")))

T512 static inline __m512 ld16(const char *base, int64_t d, int f16) {
    if (f16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + d)));
    return _mm512_loadu_ps((const float *)base + d);
}

T512 static inline __m512 round16(__m512 x) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* fma16 on 16 lanes with AVX-512F: p = v·w exact, s + e = p + acc exactly (TwoSum), s rounded to
 * float16; where s is exactly halfway between two float16 values the sign of e decides (elsewhere
 * e is too small to change the rounding) */
T512 static inline __m512 fma16_512(__m512 v, __m512 w16, __m512 acc) {
    const __m512 pr = _mm512_mul_ps(v, w16);
    const __m512 s = _mm512_add_ps(pr, acc);
    const __m512 bb = _mm512_sub_ps(s, pr);
    const __m512 e = _mm512_add_ps(_mm512_sub_ps(pr, _mm512_sub_ps(s, bb)), _mm512_sub_ps(acc, bb));
    const __m512 r = round16(s);
    const __m512 lo = _mm512_cvtph_ps(_mm512_cvtps_ph(s, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
    const __m512 hi = _mm512_cvtph_ps(_mm512_cvtps_ph(s, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC));
    const __mmask16 tie = _mm512_cmp_ps_mask(lo, hi, _CMP_NEQ_OQ) &
                          _mm512_cmp_ps_mask(_mm512_sub_ps(s, lo), _mm512_sub_ps(hi, s), _CMP_EQ_OQ);
    const __m512 zero = _mm512_setzero_ps();
    const __mmask16 up = tie & _mm512_cmp_ps_mask(e, zero, _CMP_GT_OQ);
    const __mmask16 down = tie & _mm512_cmp_ps_mask(e, zero, _CMP_LT_OQ);
    return _mm512_mask_blend_ps(down, _mm512_mask_blend_ps(up, r, hi), lo);
}

/* The float16-arithmetic columns [i, i + 64) of up to 4 pairs over a block's keys with the CPU's
 * own float16 instructions (AVX512-FP16): the same single roundings as fma16_512 */
#define TFP16 __attribute__((target("avx512fp16,avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
TFP16 static void slice_fp16(float *acc, int64_t D, int64_t i, int c0, int nc, const float *vb, int nk,
                             float msv[][KB_MAX], float vsv[][KB_MAX]) {
    __m512h y[4][2];
    for (int c = 0; c < nc; c++)
        for (int u = 0; u < 2; u++) {
            const float *a = acc + (c0 + c) * D + i + 32 * u;
            const __m256i lo = _mm512_cvtps_ph(_mm512_loadu_ps(a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m256i hi = _mm512_cvtps_ph(_mm512_loadu_ps(a + 16), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            y[c][u] = _mm512_castsi512_ph(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
        }
    for (int j = 0; j < nk; j++) {
        const float *vj = vb + j * D + i;
        __m512h v[2];
        for (int u = 0; u < 2; u++) {
            const __m256i lo = _mm512_cvtps_ph(_mm512_loadu_ps(vj + 32 * u), _MM_FROUND_TO_NEAREST_INT);
            const __m256i hi = _mm512_cvtps_ph(_mm512_loadu_ps(vj + 32 * u + 16), _MM_FROUND_TO_NEAREST_INT);
            v[u] = _mm512_castsi512_ph(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
        }
        for (int c = 0; c < nc; c++) {
            const float ms = msv[c0 + c][j], vs = vsv[c0 + c][j];
            if (vs == 0.0f && ms == 0.0f) continue; /* (outside the pair's keys) */
            if (ms != 1.0f) {
                const __m512h m = _mm512_set1_ph((_Float16)ms);
                y[c][0] = _mm512_mul_ph(y[c][0], m);
                y[c][1] = _mm512_mul_ph(y[c][1], m);
            }
            const __m512h w = _mm512_set1_ph((_Float16)vs);
            y[c][0] = _mm512_fmadd_ph(v[0], w, y[c][0]);
            y[c][1] = _mm512_fmadd_ph(v[1], w, y[c][1]);
        }
    }
    for (int c = 0; c < nc; c++)
        for (int u = 0; u < 2; u++) {
            float *a = acc + (c0 + c) * D + i + 32 * u;
            const __m512i b = _mm512_castph_si512(y[c][u]);
            _mm512_storeu_ps(a, _mm512_cvtph_ps(_mm512_castsi512_si256(b)));
            _mm512_storeu_ps(a + 16, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(b, 1)));
        }
}

static int has_fp16(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512fp16") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

/* a key's 16 lane sums of q·k before the lane tree: (a0 + a2) + (a1 + a3) */
T512 static inline __m512 dot_lanes(const float *q, const float *k, int64_t D) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < D; i += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 16), _mm512_loadu_ps(k + i + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 32), _mm512_loadu_ps(k + i + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 48), _mm512_loadu_ps(k + i + 48), a3);
    }
    return _mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3));
}

/* the scores of 16 keys (k: 16 rows of D floats): each key's lane tree as _mm512_reduce_add_ps
 * adds it (lanes i + 8 and i, then i + 4 and i, then 2 and 0, 3 and 1, then 1 and 0), 16 keys
 * side by side */
T512 static inline __m512 dots16(const float *q, const float *k, int64_t D, const params *p) {
    __m512 y[8], z[4], w[2];
    for (int m = 0; m < 8; m++) { /* keys 2m, 2m + 1: lanes i + 8 and i */
        const __m512 x0 = dot_lanes(q, k + 2 * m * D, D), x1 = dot_lanes(q, k + (2 * m + 1) * D, D);
        y[m] = _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0xEE), _mm512_shuffle_f32x4(x0, x1, 0x44));
    }
    for (int m = 0; m < 4; m++) /* keys 4m..4m + 3, a 128-bit block each: lanes i + 4 and i */
        z[m] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * m], y[2 * m + 1], 0xDD),
                             _mm512_shuffle_f32x4(y[2 * m], y[2 * m + 1], 0x88));
    for (int m = 0; m < 2; m++) /* block b: keys 8m + b, 8m + 4 + b, lanes 0 + 2 and 1 + 3 */
        w[m] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * m], z[2 * m + 1], 0x44),
                             _mm512_shuffle_ps(z[2 * m], z[2 * m + 1], 0xEE));
    /* lane 4b + i: key b + 4i, lanes 0 + 1 */
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512 s = _mm512_mul_ps(_mm512_permutexvar_ps(order, r), _mm512_set1_ps(p->scale));
    if (p->softcap != 0.0f) {
        float t[16];
        _mm512_storeu_ps(t, s);
        for (int i = 0; i < 16; i++) t[i] = p->softcap * tanhf(t[i]);
        s = _mm512_loadu_ps(t);
    }
    return s;
}

/* The keys in blocks of KB: (1) every pair's scores of the block, (2) each pair's online-softmax
 * factors in key order, (3) the V accumulation, a key at a time over the pairs. The same operations
 * per pair as pair_ref, grouped so that independent pairs and keys overlap. */
#define KB KB_MAX

/* buf: pairs' queries (n * D), accumulators (n * D), the block's K and V as float32 (2 * KB * D) */
T512 static void item_512(const item *it, const params *p, float *buf) {
    const int64_t D = p->D;
    const int f16 = p->f16, n = it->n;
    const size_t es = f16 ? 2 : 4;
    float *qb = buf, *acc = buf + n * D, *kb = acc + n * D, *vb = kb + KB * D;
    float M[MAX_CHAINS], S[MAX_CHAINS];
    float sc[MAX_CHAINS][KB], msv[MAX_CHAINS][KB], vsv[MAX_CHAINS][KB];
    for (int c = 0; c < n; c++) {
        for (int64_t d = 0; d < D; d += 16) {
            const __m512 x = _mm512_loadu_ps(it->q[c] + d);
            _mm512_storeu_ps(qb + c * D + d, f16 ? round16(x) : x);
            _mm512_storeu_ps(acc + c * D + d, _mm512_setzero_ps());
        }
        M[c] = -INFINITY;
        S[c] = 0.0f;
    }
    const int64_t ps = it->ps;
    for (int64_t b0 = it->lo_all; b0 < it->hi_all; b0 += KB) {
        const int nk = (int)(it->hi_all - b0 < KB ? it->hi_all - b0 : KB);
        for (int j = 0; j < nk; j++) { /* the block's K and V rows, converted once */
            const int64_t pos = b0 + j, row = it->table[pos / ps] * ps + pos % ps;
            const char *kr = it->k + (size_t)(row * it->rs) * es, *vr = it->v + (size_t)(row * it->rs) * es;
            for (int64_t d = 0; d < D; d += 16) {
                _mm512_storeu_ps(kb + j * D + d, ld16(kr, d, f16));
                _mm512_storeu_ps(vb + j * D + d, ld16(vr, d, f16));
            }
        }
        for (int c = 0; c < n; c++) { /* (1) scores: 16 keys' lane trees at a time, else one by one */
            const float *qc = qb + c * D;
            int j = 0;
            for (; j + 16 <= nk; j += 16) _mm512_storeu_ps(sc[c] + j, dots16(qc, kb + j * D, D, p));
            for (; j < nk; j++) {
                const __m512 x = dot_lanes(qc, kb + j * D, D);
                sc[c][j] = score(_mm512_reduce_add_ps(x), p);
            }
        }
        for (int c = 0; c < n; c++) { /* (2) softmax factors; a key outside the pair's range: ms = vs = 0 */
            const int j0 = (int)(it->lo[c] > b0 ? it->lo[c] - b0 : 0);
            const int j1 = (int)(it->hi[c] - b0 < nk ? it->hi[c] - b0 : nk);
            float m = M[c], sum = S[c];
            for (int j = 0; j < nk; j++) {
                if (j < j0 || j >= j1) {
                    msv[c][j] = vsv[c][j] = 0.0f;
                    continue;
                }
                const float s = sc[c][j];
                float ms = 1.0f, vs = 1.0f;
                if (s > m) {
                    ms = expf(m - s);
                    m = s;
                } else {
                    vs = expf(s - m);
                }
                msv[c][j] = ms;
                vsv[c][j] = vs;
                sum = fmaf(sum, ms, vs);
            }
            M[c] = m;
            S[c] = sum;
        }
        /* (3) acc = acc * ms (a new maximum); acc = fma(v, vs, acc): up to 4 pairs' accumulators
         * of one 64-column slice in registers over the block's keys */
        for (int64_t i = 0; i < D; i += 64)
            for (int c0 = 0; c0 < n; c0 += 4) {
                const int nc = n - c0 < 4 ? n - c0 : 4;
                if (i < p->n16 && p->fp16) {
                    slice_fp16(acc, D, i, c0, nc, vb, nk, msv, vsv);
                    continue;
                }
                __m512 y[4][4];
                for (int c = 0; c < nc; c++)
                    for (int u = 0; u < 4; u++) y[c][u] = _mm512_loadu_ps(acc + (c0 + c) * D + i + 16 * u);
                for (int j = 0; j < nk; j++) {
                    const float *vj = vb + j * D + i;
                    const __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16);
                    const __m512 v2 = _mm512_loadu_ps(vj + 32), v3 = _mm512_loadu_ps(vj + 48);
                    for (int c = 0; c < nc; c++) {
                        const float ms = msv[c0 + c][j], vs = vsv[c0 + c][j];
                        if (vs == 0.0f && ms == 0.0f) continue; /* (outside the pair's keys) */
                        if (i < p->n16) { /* float16 arithmetic (see fma16) */
                            if (ms != 1.0f) {
                                const __m512 vm = _mm512_set1_ps(r16(ms));
                                for (int u = 0; u < 4; u++) y[c][u] = round16(_mm512_mul_ps(y[c][u], vm));
                            }
                            const __m512 w = _mm512_set1_ps(r16(vs));
                            y[c][0] = fma16_512(v0, w, y[c][0]);
                            y[c][1] = fma16_512(v1, w, y[c][1]);
                            y[c][2] = fma16_512(v2, w, y[c][2]);
                            y[c][3] = fma16_512(v3, w, y[c][3]);
                            continue;
                        }
                        if (ms != 1.0f) {
                            const __m512 vm = _mm512_set1_ps(ms);
                            for (int u = 0; u < 4; u++) {
                                y[c][u] = _mm512_mul_ps(y[c][u], vm);
                                if (f16) y[c][u] = round16(y[c][u]);
                            }
                        }
                        const __m512 vv = _mm512_set1_ps(vs);
                        y[c][0] = _mm512_fmadd_ps(v0, vv, y[c][0]);
                        y[c][1] = _mm512_fmadd_ps(v1, vv, y[c][1]);
                        y[c][2] = _mm512_fmadd_ps(v2, vv, y[c][2]);
                        y[c][3] = _mm512_fmadd_ps(v3, vv, y[c][3]);
                        if (f16)
                            for (int u = 0; u < 4; u++) y[c][u] = round16(y[c][u]);
                    }
                }
                for (int c = 0; c < nc; c++)
                    for (int u = 0; u < 4; u++) _mm512_storeu_ps(acc + (c0 + c) * D + i + 16 * u, y[c][u]);
            }
    }
    for (int c = 0; c < n; c++) {
        const __m512 inv = _mm512_set1_ps(S[c] == 0.0f ? 0.0f : 1.0f / S[c]);
        for (int64_t d = 0; d < D; d += 16)
            _mm512_storeu_ps(it->out[c] + d, _mm512_mul_ps(_mm512_loadu_ps(acc + c * D + d), inv));
    }
}

static int has_512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
#else
static int has_512(void) { return 0; }
#endif

/* ---- the call ---- */

typedef struct {
    const float *q;
    int64_t qrs, H, Hkv, D;     /* query row stride (elements), heads, kv heads, head dim */
    const char *k, *v;
    int64_t krs;                /* K/V cache row stride in elements (Hkv * D for a contiguous pool) */
    const int64_t *seqs;        /* [n_seq, 4]: first query row, rows, first position, table offset */
    int64_t n_seq;
    const int64_t *tables;      /* page tables, concatenated */
    int64_t ps, window;
    float *out;
    int64_t ors;                /* output row stride */
} call;

typedef struct {
    int64_t seq, t0, rows, hk;
} task;

static void make_item(const call *c, const params *p, const task *tk, item *it) {
    const int64_t *sq = c->seqs + 4 * tk->seq, g = c->H / c->Hkv, D = p->D;
    const size_t es = p->f16 ? 2 : 4;
    it->n = 0;
    it->lo_all = INT64_MAX;
    it->hi_all = 0;
    for (int64_t t = tk->t0; t < tk->t0 + tk->rows; t++) {
        const int64_t pos = sq[2] + (t - sq[0]);
        const int64_t lo = c->window > 0 && pos + 1 > c->window ? pos + 1 - c->window : 0;
        for (int64_t h = tk->hk * g; h < (tk->hk + 1) * g; h++) {
            const int i = it->n++;
            it->q[i] = c->q + t * c->qrs + h * D;
            it->out[i] = c->out + t * c->ors + h * D;
            it->lo[i] = lo;
            it->hi[i] = pos + 1;
        }
        if (lo < it->lo_all) it->lo_all = lo;
        if (pos + 1 > it->hi_all) it->hi_all = pos + 1;
    }
    it->k = c->k + (size_t)(tk->hk * D) * es;
    it->v = c->v + (size_t)(tk->hk * D) * es;
    it->rs = c->krs;
    it->table = c->tables + sq[3];
    it->ps = c->ps;
}

/* per-thread work buffer, grown on demand (kept for the thread's life) */
static float *work_buffer(size_t floats) {
    static __thread float *buf;
    static __thread size_t cap;
    if (floats > cap) {
        free(buf);
        cap = (floats + 1023) / 1024 * 1024;
        buf = aligned_alloc(64, cap * sizeof(float));
    }
    return buf;
}

static void run_task(const call *c, const params *p, const task *t, int use512) {
    const int64_t D = p->D;
    float *buf = work_buffer((size_t)(2 * MAX_CHAINS * D + 2 * KB_MAX * D + 16));
    task tk = *t;
    item it;
    if (!use512) tk.rows = 1; /* (the scalar functions take any item; keep it small) */
    for (int64_t r = t->t0; r < t->t0 + t->rows; r += tk.rows) {
        tk.t0 = r;
        make_item(c, p, &tk, &it);
#ifdef ATTN_X86
        if (use512)
            item_512(&it, p, buf);
        else
#endif
            item_ref(&it, p, buf);
    }
}

static void attend(const call *c, const params *p, int nthreads, int isa) {
    const int64_t g = c->H / c->Hkv, D = p->D;
    const int64_t R = g >= MAX_CHAINS ? 1 : (MAX_CHAINS / g < MAX_ROWS ? MAX_CHAINS / g : MAX_ROWS);
    int64_t n_tasks = 0, work = 0;
    for (int64_t s = 0; s < c->n_seq; s++) {
        const int64_t n = c->seqs[4 * s + 1], p0 = c->seqs[4 * s + 2];
        n_tasks += (n + R - 1) / R * c->Hkv;
        work += n * (c->window > 0 && p0 + n > c->window ? c->window : p0 + n);
    }
    task small[64];
    task *tasks = n_tasks <= 64 ? small : malloc((size_t)n_tasks * sizeof(task));
    int64_t k = 0;
    for (int64_t s = 0; s < c->n_seq; s++) {
        const int64_t q0 = c->seqs[4 * s], n = c->seqs[4 * s + 1];
        for (int64_t t = q0; t < q0 + n; t += R)
            for (int64_t hk = 0; hk < c->Hkv; hk++) tasks[k++] = (task){s, t, t + R < q0 + n ? R : q0 + n - t, hk};
    }
    const int use512 = isa && D % 64 == 0 && g <= MAX_CHAINS;
    /* threads only where the work pays for waking them (~0.1 ms of it) */
    if (nthreads <= 1 || n_tasks < 2 || work * c->H * D < (1 << 20)) {
        for (int64_t i = 0; i < n_tasks; i++) run_task(c, p, &tasks[i], use512);
    } else {
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)
        for (int64_t i = 0; i < n_tasks; i++) run_task(c, p, &tasks[i], use512);
    }
    if (tasks != small) free(tasks);
}

/* ---- Python ---- */

static PyObject *py_attend(PyObject *self, PyObject *args) {
    unsigned long long qp, kp, vp, sp, tp, op;
    long long qrs, H, Hkv, D, krs, n_seq, ps, window, ors;
    int f16, nthreads, isa;
    float scale, softcap;
    if (!PyArg_ParseTuple(args, "KLLLLKKLiKLKLLKLffii", &qp, &qrs, &H, &Hkv, &D, &kp, &vp, &krs, &f16, &sp, &n_seq,
                          &tp, &ps, &window, &op, &ors, &scale, &softcap, &nthreads, &isa))
        return NULL;
    if (H <= 0 || Hkv <= 0 || H % Hkv || D <= 0 || ps <= 0 || n_seq < 0) {
        PyErr_SetString(PyExc_ValueError, "attn.attend: bad shape");
        return NULL;
    }
    call c = {(const float *)qp, qrs, H, Hkv, D, (const char *)kp, (const char *)vp, krs, (const int64_t *)sp,
              n_seq, (const int64_t *)tp, ps, window, (float *)op, ors};
    params p = {D, f16, f16 && D >= 128 ? D & ~(long long)127 : 0, 0, softcap != 0.0f ? scale / softcap : scale, softcap};
    if (isa < 0 || isa > 2) isa = 2;
    if (isa && !has_512()) isa = 0;
#ifdef ATTN_X86
    if (isa == 2 && !has_fp16()) isa = 1;
#endif
    p.fp16 = isa == 2;
    Py_BEGIN_ALLOW_THREADS
    attend(&c, &p, nthreads, isa);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_best_isa(PyObject *self, PyObject *args) {
#ifdef ATTN_X86
    if (has_512() && has_fp16()) return PyLong_FromLong(2);
#endif
    return PyLong_FromLong(has_512());
}

static PyMethodDef methods[] = {
    {"attend", py_attend, METH_VARARGS,
     "attend(q, q_row_stride, H, Hkv, D, k, v, kv_row_stride, f16, seqs, n_seq, tables, page_size, window, out, "
     "out_row_stride, scale, softcap, nthreads, isa): one layer's attention (pointers as integers)"},
    {"best_isa", py_best_isa, METH_NOARGS,
     "2 AVX-512 with AVX512-FP16, 1 AVX-512, 0 scalar: the best this CPU runs (isa= caps it per call)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_attn", NULL, -1, methods};

PyMODINIT_FUNC PyInit__attn(void) { return PyModule_Create(&module); }

/* The native CPU attention with AVX-512 (and AVX512-FP16 for the float16 accumulation arithmetic):
 * the item's pairs walk the keys together in blocks; the same bits as attn_scalar.c. Each function
 * carries its own target attribute and is chosen at run time (no -march). */
#include "attn_cpu.h"

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

int has_fp16(void) {
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
T512 void item_512(const item *it, const params *p, float *buf) {
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

int has_512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
#else
int has_512(void) { return 0; }
int has_fp16(void) { return 0; }
#endif

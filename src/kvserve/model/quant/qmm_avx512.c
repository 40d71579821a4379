/* AVX-512: the activation quantizers, the VNNI column tiles (256-bit vectors, few rows) and the
 * VNNI row tiles (16 rows in the lanes of a vector). */
#include "qmm_cols.h"

#ifdef QMM_X86
/* the same activation blocks with AVX-512 (bit for bit: max and the first maximum's index are
 * order-free, products and round-to-nearest-even conversions are elementwise) */
__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
void quantize_row_32_512(const float *x, int64_t k, act32 *out) {
    const __m512 sign = _mm512_set1_ps(-0.f);
    for (int64_t b = 0; b < k / 32; b++, x += 32) {
        const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, x0), _mm512_andnot_ps(sign, x1)));
        const float d = amax / 127.f, id = amax != 0.f ? 127.f / amax : 0.f;
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, vid)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, vid));
        _mm_storeu_si128((__m128i *)out[b].q, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(out[b].q + 16), _mm512_cvtepi32_epi8(q1));
        const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        out[b].d = round_f16(d);
        out[b].s = round_f16(d * (float)sum);
        out[b].isum = sum;
        out[b].pad = 0;
    }
}

__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
void quantize_row_K_512(const float *x, int64_t k, actK *out) {
    const __m512 sign = _mm512_set1_ps(-0.f);
    for (int64_t b = 0; b < k / 256; b++, x += 256) {
        __m512 m = _mm512_setzero_ps();
        for (int i = 0; i < 256; i += 16) m = _mm512_max_ps(m, _mm512_andnot_ps(sign, _mm512_loadu_ps(x + i)));
        const float amax = _mm512_reduce_max_ps(m);
        memset(&out[b], 0, sizeof(actK));
        if (amax == 0.f) continue;
        int at = 0; /* the first element of that magnitude, as the scalar scan keeps it */
        for (int i = 0; i < 256; i += 16) {
            const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + i)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (eq) {
                at = i + __builtin_ctz(eq);
                break;
            }
        }
        const float iscale = -127.f / x[at];
        const __m512 vs = _mm512_set1_ps(iscale);
        for (int j = 0; j < 16; j++) {
            __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(vs, _mm512_loadu_ps(x + 16 * j))), _mm512_set1_epi32(127));
            _mm_storeu_si128((__m128i *)(out[b].q + 16 * j), _mm512_cvtepi32_epi8(q));
            out[b].bsums[j] = (int16_t)_mm512_reduce_add_epi32(q);
        }
        out[b].d = 1.f / iscale;
    }
}

#define DOT32_512(fmt, c, q) dot_u8s8_512(c, q)
T_AVX512 INLINE void cols_512(const int fmt, TILE_ARGS) { COLS_BODY(codes32_512, codesK_512, DOT32_512, 0, f16_pairs_512) }
SPECIALIZE(tile_512_cols_std, cols_512, T_AVX512)

/* ---- ggml's vec_dot lanes (Q4_1, Q8_0; qmm_scalar.c's tile_lanes_scalar): two columns in the
 * halves of a vector, lane j of a half = codes 4j..4j+3 of that column's block (one VNNI dot of
 * unsigned codes and the signed activation codes), acc = fma(dx·dy, lane, acc) per half; 8
 * columns × LR rows per tile ---- */

#define LR 4

/* 64 unsigned codes: column a's block in the low half, column b's in the high half (Q8_0: the
 * signed weights + 128) */
T_AVX512 INLINE __m512i lane_codes_512(const int fmt, const uint8_t *wa, const uint8_t *wb) {
    if (fmt == F_Q8_0) {
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(wa + 2))),
                                             _mm256_loadu_si256((const __m256i *)(wb + 2)), 1);
        return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    }
    /* [qa, qa, qb, qb] by broadcasting loads, then 16-byte chunks 1 and 3 shifted to the high nibbles */
    __m512i v = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(wa + 4))),
                                            0xFF00, _mm_loadu_si128((const __m128i *)(wb + 4)));
    v = _mm512_mask_srli_epi16(v, 0xFF00FF00u, v, 4);
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
}

/* hsum_float_8 of each half: lane 0 = the low half's, lane 8 = the high half's (the same
 * additions: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))) */
T_AVX512 INLINE __m512 hsum8_halves(__m512 a) {
    a = _mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, _MM_SHUFFLE(2, 3, 0, 1)));
    a = _mm512_add_ps(a, _mm512_permute_ps(a, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm512_add_ps(a, _mm512_permute_ps(a, _MM_SHUFFLE(2, 3, 0, 1)));
}

T_AVX512 INLINE void lanes_512(const int fmt, TILE_ARGS) {
    const int64_t nb = K / 32, bb = BLOCK_BYTES[fmt];
    const __m512i zero = _mm512_setzero_si512(), u128 = _mm512_set1_epi8((char)0x80);
    const __m512i pair_idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i pick2 = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 24, 16, 8, 0);
    const __m512i pick4 = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 19, 18, 17, 16, 3, 2, 1, 0);
    for (int64_t n = n0; n < n1; n += 8) {
        const int nc = n1 - n < 8 ? (int)(n1 - n) : 8;
        const uint8_t *col[8];
        _Alignas(32) int32_t cidx[8];
        for (int j = 0; j < 8; j++) {
            col[j] = W + (n + (j < nc ? j : nc - 1)) * rb; /* pad: repeat the last */
            cidx[j] = (int32_t)((j < nc ? j : nc - 1) * rb);
        }
        const __m256i vidx = _mm256_load_si256((const __m256i *)cidx);
        for (int64_t mm = m0; mm < m1; mm += LR) {
            const int mr = m1 - mm < LR ? (int)(m1 - mm) : LR;
            __m512 acc[LR][4];
            __m256 sm[LR];
            for (int r = 0; r < LR; r++) {
                sm[r] = _mm256_setzero_ps();
                for (int p = 0; p < 4; p++) acc[r][p] = _mm512_setzero_ps();
            }
            for (int64_t b = 0; b < nb; b++) {
                const int64_t off = b * bb;
                if (mm == m0) { /* the next columns' bytes, a slice per block (as the column tiles) */
                    const uint8_t *pf = W + (n + 8 * PF_GROUPS) * rb + 8 * off;
                    for (int l = 0; l < 8 * bb; l += 64) _mm_prefetch((const char *)pf + l, _MM_HINT_T0);
                }
                __m256 dx, mx;
                f16_pairs_512(col[0] + off, vidx, &dx, &mx); /* Q8_0: mx is its first codes, unused */
                const __m512 dx16 = _mm512_castps256_ps512(dx);
                __m512i wc[4];
                __m512 dxp[4];
                for (int p = 0; p < 4; p++) {
                    wc[p] = lane_codes_512(fmt, col[2 * p] + off, col[2 * p + 1] + off);
                    dxp[p] = _mm512_permutexvar_ps(_mm512_add_epi32(pair_idx, _mm512_set1_epi32(2 * p)), dx16);
                }
                for (int r = 0; r < mr; r++) {
                    const act32 *a = (const act32 *)act + (mm + r) * nb + b;
                    const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)a->q));
                    const __m512 dy = _mm512_set1_ps(a->d);
                    /* Q8_0: codes + 128, so each lane starts at −128 · (its four activation codes) */
                    const __m512i s0 = fmt == F_Q8_0 ? _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, u128, q)) : zero;
                    for (int p = 0; p < 4; p++)
                        acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(dxp[p], dy),
                                                    _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(s0, wc[p], q)), acc[r][p]);
                    if (fmt == F_Q4_1) sm[r] = _mm256_fmadd_ps(mx, _mm256_set1_ps(a->s), sm[r]);
                }
            }
            for (int r = 0; r < mr; r++) {
                const __m512 h01 = _mm512_permutex2var_ps(hsum8_halves(acc[r][0]), pick2, hsum8_halves(acc[r][1]));
                const __m512 h23 = _mm512_permutex2var_ps(hsum8_halves(acc[r][2]), pick2, hsum8_halves(acc[r][3]));
                __m256 h = _mm512_castps512_ps256(_mm512_permutex2var_ps(h01, pick4, h23)); /* columns 0..7 */
                if (fmt == F_Q4_1) h = _mm256_add_ps(h, sm[r]);
                _mm256_mask_storeu_ps(y + (mm + r) * ldy + n, (__mmask8)((1u << nc) - 1), h);
            }
        }
    }
}

T_AVX512 void tile_512_cols(int fmt, TILE_ARGS) {
    if (fmt == F_Q4_1) lanes_512(F_Q4_1, TILE_PASS);
    else if (fmt == F_Q8_0) lanes_512(F_Q8_0, TILE_PASS);
    else tile_512_cols_std(fmt, TILE_PASS);
}

/* ---- AVX-512 VNNI row tiles: 16 rows in the lanes of a vector, weights broadcast ---- */

#define NT 4 /* columns per row tile */

/* rows [16·g0, 16·(g0 + RG)) × columns [n0, n1), n1 − n0 ≤ NT: RG groups of 16 rows share each
 * broadcast weight word; activation codes are read from memory (L1) by the VNNI instruction */
#define ROWS_BODY(RG)                                                                                    \
    const int64_t nb = K / BLOCK_W[fmt];                                                                 \
    const int nc = (int)(n1 - n0);                                                                       \
    __m512 acc[RG][NT];                                                                                  \
    for (int r = 0; r < RG; r++)                                                                         \
        for (int j = 0; j < NT; j++) acc[r][j] = _mm512_setzero_ps();                                    \
    _Alignas(64) uint8_t c[NT][256];                                                                     \
    const uint8_t *col[NT];                                                                              \
    for (int j = 0; j < NT; j++) col[j] = W + (n0 + (j < nc ? j : nc - 1)) * rb;                         \
    if (BLOCK_W[fmt] == 32) {                                                                            \
        const act32x16 *A = (const act32x16 *)actx + g0 * nb;                                            \
        const int z = ZERO_OF[fmt];                                                                      \
        for (int64_t b = 0; b < nb; b++) {                                                               \
            const int64_t off = b * BLOCK_BYTES[fmt];                                                    \
            for (int j = 0; j < NT; j++) _mm256_store_si256((__m256i *)c[j], codes32_512(fmt, col[j] + off)); \
            for (int j = 0; j < NT; j++) {                                                               \
                const int32_t *c4 = (const int32_t *)c[j];                                               \
                __m512i s[RG][2];                                                                        \
                for (int r = 0; r < RG; r++) {                                                           \
                    s[r][0] = z ? _mm512_mullo_epi32(_mm512_loadu_si512((const void *)A[r * nb + b].isum), \
                                                     _mm512_set1_epi32(-z))                              \
                                : _mm512_setzero_si512();                                                \
                    s[r][1] = _mm512_setzero_si512();                                                    \
                }                                                                                        \
                for (int k = 0; k < 8; k++) {                                                            \
                    const __m512i wk = _mm512_set1_epi32(c4[k]);                                         \
                    for (int r = 0; r < RG; r++)                                                         \
                        s[r][k & 1] = _mm512_dpbusd_epi32(s[r][k & 1], wk,                               \
                                                          _mm512_load_si512((const void *)A[r * nb + b].q[k])); \
                }                                                                                        \
                const __m512 dx = _mm512_set1_ps(_cvtsh_ss(rd16(col[j] + off)));                         \
                for (int r = 0; r < RG; r++) {                                                           \
                    const act32x16 *a = &A[r * nb + b];                                                  \
                    acc[r][j] = _mm512_fmadd_ps(_mm512_mul_ps(dx, _mm512_loadu_ps(a->d)),                \
                                                _mm512_cvtepi32_ps(_mm512_add_epi32(s[r][0], s[r][1])), acc[r][j]); \
                    if (fmt == F_Q4_1 || fmt == F_Q5_1)                                                  \
                        acc[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(rd16(col[j] + off + 2))),   \
                                                    _mm512_loadu_ps(a->s), acc[r][j]);                   \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
    } else {                                                                                             \
        const actKx16 *A = (const actKx16 *)actx + g0 * nb;                                              \
        for (int64_t b = 0; b < nb; b++) {                                                               \
            const int64_t off = b * BLOCK_BYTES[fmt];                                                    \
            for (int j = 0; j < NT; j++) {                                                               \
                const uint8_t *w = col[j] + off;                                                         \
                __m256i cv[8];                                                                           \
                codesK_512(fmt, w, cv);                                                                  \
                for (int v = 0; v < 8; v++) _mm256_store_si256((__m256i *)(c[0] + 32 * v), cv[v]);      \
                const int32_t *c4 = (const int32_t *)c[0];                                               \
                const float dxs = _cvtsh_ss(rd16(fmt == F_Q6_K ? w + 208 : w));                          \
                __m512i s[RG], t[RG];                                                                    \
                for (int r = 0; r < RG; r++) s[r] = t[r] = _mm512_setzero_si512();                       \
                if (fmt == F_Q6_K) {                                                                     \
                    const int8_t *sc = (const int8_t *)(w + 192);                                        \
                    for (int sb = 0; sb < 16; sb++) {                                                    \
                        __m512i u[RG];                                                                   \
                        for (int r = 0; r < RG; r++)                                                     \
                            u[r] = _mm512_slli_epi32(_mm512_load_si512((const void *)A[r * nb + b].bs16[sb]), 5); \
                        for (int r = 0; r < RG; r++) u[r] = _mm512_sub_epi32(_mm512_setzero_si512(), u[r]); \
                        for (int k = 0; k < 4; k++) {                                                    \
                            const __m512i wk = _mm512_set1_epi32(c4[4 * sb + k]);                        \
                            for (int r = 0; r < RG; r++)                                                 \
                                u[r] = _mm512_dpbusd_epi32(u[r], wk, _mm512_load_si512((const void *)A[r * nb + b].q[4 * sb + k])); \
                        }                                                                                \
                        const __m512i scv = _mm512_set1_epi32(sc[sb]);                                   \
                        for (int r = 0; r < RG; r++) s[r] = _mm512_add_epi32(s[r], _mm512_mullo_epi32(u[r], scv)); \
                    }                                                                                    \
                    for (int r = 0; r < RG; r++)                                                         \
                        acc[r][j] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dxs), _mm512_loadu_ps(A[r * nb + b].d)), \
                                                    _mm512_cvtepi32_ps(s[r]), acc[r][j]);                \
                } else {                                                                                 \
                    uint8_t sc[8], mn[8];                                                                \
                    k_scales(w + 4, sc, mn);                                                             \
                    for (int sb = 0; sb < 8; sb++) {                                                     \
                        __m512i u[RG][2];                                                                \
                        for (int r = 0; r < RG; r++) u[r][0] = u[r][1] = _mm512_setzero_si512();         \
                        for (int k = 0; k < 8; k++) {                                                    \
                            const __m512i wk = _mm512_set1_epi32(c4[8 * sb + k]);                        \
                            for (int r = 0; r < RG; r++)                                                 \
                                u[r][k & 1] = _mm512_dpbusd_epi32(u[r][k & 1], wk,                       \
                                    _mm512_load_si512((const void *)A[r * nb + b].q[8 * sb + k]));       \
                        }                                                                                \
                        const __m512i scv = _mm512_set1_epi32(sc[sb]), mnv = _mm512_set1_epi32(mn[sb]);  \
                        for (int r = 0; r < RG; r++) {                                                   \
                            s[r] = _mm512_add_epi32(s[r], _mm512_mullo_epi32(_mm512_add_epi32(u[r][0], u[r][1]), scv)); \
                            t[r] = _mm512_add_epi32(t[r], _mm512_mullo_epi32(                            \
                                _mm512_load_si512((const void *)A[r * nb + b].bs32[sb]), mnv));          \
                        }                                                                                \
                    }                                                                                    \
                    const float dmin = _cvtsh_ss(rd16(w + 2));                                           \
                    for (int r = 0; r < RG; r++) {                                                       \
                        const __m512 dy = _mm512_loadu_ps(A[r * nb + b].d);                              \
                        __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dxs), dy), _mm512_cvtepi32_ps(s[r]), acc[r][j]); \
                        acc[r][j] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(-dmin), dy), _mm512_cvtepi32_ps(t[r]), v); \
                    }                                                                                    \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
    for (int r = 0; r < RG; r++)                                                                         \
        for (int j = 0; j < nc; j++) {                                                                   \
            _Alignas(64) float o[16];                                                                    \
            _mm512_store_ps(o, acc[r][j]);                                                               \
            for (int i = 0; i < 16; i++) y[(16 * (g0 + r) + i) * ldy + n0 + j] = o[i];                   \
        }

#define ROWS_ARGS const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const void *actx, int64_t g0, int64_t K, \
                  float *y, int64_t ldy
T_AVX512 INLINE void rows4_512(const int fmt, ROWS_ARGS) { ROWS_BODY(4) }
T_AVX512 INLINE void rows1_512(const int fmt, ROWS_ARGS) { ROWS_BODY(1) }

#define ROWS_SWITCH(IMPL)                                                                                \
    switch (fmt) {                                                                                       \
    case F_Q4_0: IMPL(F_Q4_0, W, rb, n0, n1, actx, g0, K, y, ldy); break;                                \
    case F_Q4_1: IMPL(F_Q4_1, W, rb, n0, n1, actx, g0, K, y, ldy); break;                                \
    case F_Q5_0: IMPL(F_Q5_0, W, rb, n0, n1, actx, g0, K, y, ldy); break;                                \
    case F_Q5_1: IMPL(F_Q5_1, W, rb, n0, n1, actx, g0, K, y, ldy); break;                                \
    case F_Q8_0: IMPL(F_Q8_0, W, rb, n0, n1, actx, g0, K, y, ldy); break;                                \
    case F_Q4_K: IMPL(F_Q4_K, W, rb, n0, n1, actx, g0, K, y, ldy); break;                                \
    case F_Q5_K: IMPL(F_Q5_K, W, rb, n0, n1, actx, g0, K, y, ldy); break;                                \
    default: IMPL(F_Q6_K, W, rb, n0, n1, actx, g0, K, y, ldy); break;                                    \
    }

/* ggml's vec_dot lanes (Q4_1, Q8_0) for 16 rows in the lanes of a vector: lane accumulator j of
 * a column is one vector (16 rows), fed by the VNNI dot of the column's codes 4j..4j+3 (broadcast)
 * with the rows' codes 4j..4j+3; the 8 accumulators summed as hsum_float_8 sums its lanes */
#define NTL 2
T_AVX512 INLINE void lanes_rows_512(const int fmt, ROWS_ARGS) {
    const int64_t nb = K / 32, bb = BLOCK_BYTES[fmt];
    const int nc = (int)(n1 - n0);
    const act32x16 *A = (const act32x16 *)actx + g0 * nb;
    const uint8_t *col[NTL];
    for (int j = 0; j < NTL; j++) col[j] = W + (n0 + (j < nc ? j : nc - 1)) * rb;
    __m512 acc[NTL][8], sacc[NTL];
    for (int j = 0; j < NTL; j++) {
        sacc[j] = _mm512_setzero_ps();
        for (int k = 0; k < 8; k++) acc[j][k] = _mm512_setzero_ps();
    }
    const __m512i zero = _mm512_setzero_si512(), u128 = _mm512_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b++) {
        const act32x16 *a = &A[b];
        const int64_t off = b * bb;
        const __m512 dy = _mm512_loadu_ps(a->d);
        _Alignas(64) int32_t s0[8][16]; /* Q8_0: −128 · each row's codes 4k..4k+3 (codes + 128 below) */
        if (fmt == F_Q8_0)
            for (int k = 0; k < 8; k++)
                _mm512_store_si512((void *)s0[k], _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, u128,
                                                                   _mm512_load_si512((const void *)a->q[k]))));
        for (int j = 0; j < NTL; j++) {
            const uint8_t *w = col[j] + off;
            _Alignas(32) int32_t c4[8];
            _mm256_store_si256((__m256i *)c4, codes32_512(fmt, w)); /* Q8_0: + 128 */
            const __m512 d = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(rd16(w))), dy);
            for (int k = 0; k < 8; k++) {
                const __m512i init = fmt == F_Q8_0 ? _mm512_load_si512((const void *)s0[k]) : zero;
                const __m512i sk = _mm512_dpbusd_epi32(init, _mm512_set1_epi32(c4[k]),
                                                       _mm512_load_si512((const void *)a->q[k]));
                acc[j][k] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sk), acc[j][k]);
            }
            if (fmt == F_Q4_1)
                sacc[j] = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(rd16(w + 2))), _mm512_loadu_ps(a->s), sacc[j]);
        }
    }
    for (int j = 0; j < nc; j++) {
        __m512 *v = acc[j];
        __m512 h = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v[0], v[4]), _mm512_add_ps(v[2], v[6])),
                                 _mm512_add_ps(_mm512_add_ps(v[1], v[5]), _mm512_add_ps(v[3], v[7])));
        if (fmt == F_Q4_1) h = _mm512_add_ps(h, sacc[j]);
        _Alignas(64) float o[16];
        _mm512_store_ps(o, h);
        for (int i = 0; i < 16; i++) y[(16 * g0 + i) * ldy + n0 + j] = o[i];
    }
}

/* row groups [g0, g1) × columns [n0, n1) */
T_AVX512 void tile_512_rows(int fmt, const uint8_t *W, int64_t rb, int64_t n0_, int64_t n1_,
                                   const void *actx, int64_t g0_, int64_t g1, int64_t K, float *y, int64_t ldy) {
    if (lane_fmt(fmt)) {
        for (int64_t n0 = n0_; n0 < n1_; n0 += NTL) {
            const int64_t n1 = n0 + NTL < n1_ ? n0 + NTL : n1_;
            for (int64_t g0 = g0_; g0 < g1; g0++) {
                if (fmt == F_Q4_1) lanes_rows_512(F_Q4_1, W, rb, n0, n1, actx, g0, K, y, ldy);
                else lanes_rows_512(F_Q8_0, W, rb, n0, n1, actx, g0, K, y, ldy);
            }
        }
        return;
    }
    for (int64_t n0 = n0_; n0 < n1_; n0 += NT) {
        const int64_t n1 = n0 + NT < n1_ ? n0 + NT : n1_;
        int64_t g0 = g0_;
        for (; g0 + 4 <= g1; g0 += 4) { ROWS_SWITCH(rows4_512) }
        for (; g0 < g1; g0++) { ROWS_SWITCH(rows1_512) }
    }
}
#endif /* QMM_X86 */

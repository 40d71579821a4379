/* The column tile's body (rows × 8 columns, lanes over K, 256-bit vectors), instantiated by
 * qmm_avx2.c and qmm_avx512.c with their own decoders and dot products. */
#ifndef KVSERVE_QMM_COLS_H
#define KVSERVE_QMM_COLS_H

#include "qmm_simd.h"

#define PF_GROUPS 2 /* prefetch distance in groups of 8 columns */
#define NEG(v) _mm256_xor_ps(v, _mm256_set1_ps(-0.f))

/* rows [m0, m1) × columns [n0, n1): lanes over K, 8 columns at a time (their block dots reduced
 * into the 8 lanes of one vector, so the float side runs per column lane); each block's codes
 * decoded once for up to 16 rows. K-quant sub-blocks: u8·s8 pairs (maddubs, exact for codes
 * < 64) times the int16 sub-scales (madd). */
#define COLS_BODY(CODES32, CODESK, DOT32, SIGNED_Q8, F16_PAIRS)                                       \
    const int64_t nb = K / BLOCK_W[fmt];                                                               \
    const int z = ZERO_OF[fmt];                                                                        \
    __m256 acc[16];                                                                                    \
    __m256i part[16][8], tpart[16][8];                                                                 \
    for (int64_t n = n0; n < n1; n += 8) {                                                             \
        const int nc = n1 - n < 8 ? (int)(n1 - n) : 8;                                                 \
        const uint8_t *col[8];                                                                         \
        _Alignas(32) int32_t cidx[8];                                                                  \
        for (int j = 0; j < 8; j++) {                                                                  \
            col[j] = W + (n + (j < nc ? j : nc - 1)) * rb; /* pad: repeat the last column */           \
            cidx[j] = (int32_t)((j < nc ? j : nc - 1) * rb);                                           \
        }                                                                                              \
        const __m256i vidx = _mm256_load_si256((const __m256i *)cidx);                                 \
        for (int64_t mm = m0; mm < m1; mm += 16) {                                                     \
            const int mr = m1 - mm < 16 ? (int)(m1 - mm) : 16;                                         \
            for (int r = 0; r < mr; r++) acc[r] = _mm256_setzero_ps();                                 \
            for (int64_t b = 0; b < nb; b++) {                                                         \
                const int64_t off = b * BLOCK_BYTES[fmt];                                              \
                /* the next columns' bytes, a slice per block: their rows are short streams that   \
                 * the hardware prefetcher does not pick up in time */                              \
                const uint8_t *pf = W + (n + 8 * PF_GROUPS) * rb + 8 * off;                            \
                for (int l = 0; l < 8 * BLOCK_BYTES[fmt]; l += 64) _mm_prefetch((const char *)pf + l, _MM_HINT_T0); \
                if (BLOCK_W[fmt] == 32) {                                                              \
                    __m256i c[8];                                                                      \
                    for (int j = 0; j < 8; j++) c[j] = CODES32(fmt, col[j] + off);                     \
                    __m256 dx, mx;                                                                     \
                    F16_PAIRS(col[0] + off, vidx, &dx, &mx);                                           \
                    for (int r = 0; r < mr; r++) {                                                     \
                        const act32 *a = (const act32 *)act + (mm + r) * nb + b;                       \
                        const __m256i q = _mm256_loadu_si256((const __m256i *)a->q);                   \
                        __m256i d[8];                                                                  \
                        for (int j = 0; j < 8; j++) d[j] = DOT32(fmt, c[j], q);                           \
                        __m256i sv = reduce8(d);                                                       \
                        if (!(SIGNED_Q8 && fmt == F_Q8_0) && z)                                        \
                            sv = _mm256_sub_epi32(sv, _mm256_set1_epi32(z * a->isum));                 \
                        __m256 t = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(a->d)),            \
                                                   _mm256_cvtepi32_ps(sv), acc[r]);                    \
                        if (fmt == F_Q4_1 || fmt == F_Q5_1) t = _mm256_fmadd_ps(mx, _mm256_set1_ps(a->s), t); \
                        acc[r] = t;                                                                    \
                    }                                                                                  \
                } else {                                                                               \
                    for (int j = 0; j < 8; j++) {                                                      \
                        const uint8_t *w = col[j] + off;                                               \
                        __m256i c[8];                                                                  \
                        CODESK(fmt, w, c);                                                             \
                        if (fmt == F_Q6_K) {                                                           \
                            const int8_t *sc8 = (const int8_t *)(w + 192);                             \
                            __m256i scv[8];                                                            \
                            for (int v = 0; v < 8; v++)                                                \
                                scv[v] = _mm256_set_m128i(_mm_set1_epi16(sc8[2 * v + 1]), _mm_set1_epi16(sc8[2 * v])); \
                            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc8)); \
                            for (int r = 0; r < mr; r++) {                                             \
                                const actK *a = (const actK *)act + (mm + r) * nb + b;                 \
                                __m256i sv = _mm256_setzero_si256();                                   \
                                for (int v = 0; v < 8; v++)                                            \
                                    sv = _mm256_add_epi32(sv, _mm256_madd_epi16(_mm256_maddubs_epi16(  \
                                        c[v], _mm256_loadu_si256((const __m256i *)(a->q + 32 * v))), scv[v])); \
                                const __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);      \
                                part[r][j] = _mm256_sub_epi32(sv, _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5)); \
                            }                                                                          \
                        } else {                                                                       \
                            uint8_t sc[8], mn[8];                                                      \
                            k_scales(w + 4, sc, mn);                                                   \
                            _Alignas(32) int16_t mn16[16];                                             \
                            for (int i = 0; i < 8; i++) mn16[2 * i] = mn16[2 * i + 1] = mn[i];         \
                            const __m256i mnv = _mm256_load_si256((const __m256i *)mn16);              \
                            for (int r = 0; r < mr; r++) {                                             \
                                const actK *a = (const actK *)act + (mm + r) * nb + b;                 \
                                __m256i sv = _mm256_setzero_si256();                                   \
                                for (int i = 0; i < 8; i++)                                            \
                                    sv = _mm256_add_epi32(sv, _mm256_madd_epi16(_mm256_maddubs_epi16(  \
                                        c[i], _mm256_loadu_si256((const __m256i *)(a->q + 32 * i))),    \
                                        _mm256_set1_epi16(sc[i])));                                    \
                                part[r][j] = sv;                                                       \
                                tpart[r][j] = _mm256_madd_epi16(mnv, _mm256_loadu_si256((const __m256i *)a->bsums)); \
                            }                                                                          \
                        }                                                                              \
                    }                                                                                  \
                    __m256 dx, dm; /* Q6_K: d is the high half of the dword at 206 */                  \
                    if (fmt == F_Q6_K) F16_PAIRS(col[0] + off + 206, vidx, &dm, &dx);                  \
                    else F16_PAIRS(col[0] + off, vidx, &dx, &dm);                                      \
                    for (int r = 0; r < mr; r++) {                                                     \
                        const actK *a = (const actK *)act + (mm + r) * nb + b;                         \
                        const __m256 dy = _mm256_set1_ps(a->d);                                        \
                        __m256 t = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(reduce8(part[r])), acc[r]); \
                        if (fmt != F_Q6_K)                                                             \
                            t = _mm256_fmadd_ps(_mm256_mul_ps(NEG(dm), dy),                            \
                                                _mm256_cvtepi32_ps(reduce8(tpart[r])), t);             \
                        acc[r] = t;                                                                    \
                    }                                                                                  \
                }                                                                                      \
            }                                                                                          \
            for (int r = 0; r < mr; r++) {                                                             \
                _Alignas(32) float o[8];                                                               \
                _mm256_store_ps(o, acc[r]);                                                            \
                for (int j = 0; j < nc; j++) y[(mm + r) * ldy + n + j] = o[j];                         \
            }                                                                                          \
        }                                                                                              \
    }

/* one copy of an always-inlined body per format: the format's branches fold away */
#define SPECIALIZE(NAME, IMPL, TARGET)                                                  \
    TARGET void NAME(int fmt, TILE_ARGS) {                                              \
        switch (fmt) {                                                                  \
        case F_Q4_0: IMPL(F_Q4_0, TILE_PASS); break;                                    \
        case F_Q4_1: IMPL(F_Q4_1, TILE_PASS); break;                                    \
        case F_Q5_0: IMPL(F_Q5_0, TILE_PASS); break;                                    \
        case F_Q5_1: IMPL(F_Q5_1, TILE_PASS); break;                                    \
        case F_Q8_0: IMPL(F_Q8_0, TILE_PASS); break;                                    \
        case F_Q4_K: IMPL(F_Q4_K, TILE_PASS); break;                                    \
        case F_Q5_K: IMPL(F_Q5_K, TILE_PASS); break;                                    \
        default: IMPL(F_Q6_K, TILE_PASS); break;                                        \
        }                                                                               \
    }

#endif /* KVSERVE_QMM_COLS_H */

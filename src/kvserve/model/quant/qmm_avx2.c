/* AVX2 column tiles (rows × one column per lane group, lanes over K). */
#include "qmm_cols.h"

#ifdef QMM_X86
#define DOT32_AVX2(fmt, c, q) ((fmt) == F_Q8_0 ? dot_s8s8_avx2(c, q) : dot_u8s8_avx2(c, q))
T_AVX2 INLINE void cols_avx2(const int fmt, TILE_ARGS) { COLS_BODY(codes32_avx2, codesK_avx2, DOT32_AVX2, 1, f16_pairs_avx2) }
SPECIALIZE(tile_avx2_std, cols_avx2, T_AVX2)

/* ggml's vec_dot lanes (qmm_scalar.c's tile_lanes_scalar): one column, 4 rows at a time, the
 * eight 32-bit lanes of a block's dot (maddubs + madd: codes 4j..4j+3 in lane j) are ggml's */
T_AVX2 INLINE void lanes_avx2(const int fmt, TILE_ARGS) {
    const int64_t nb = K / 32;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *col = W + n * rb;
        for (int64_t mm = m0; mm < m1; mm += 4) {
            const int mr = m1 - mm < 4 ? (int)(m1 - mm) : 4;
            __m256 acc[4];
            float summs[4] = {0.f, 0.f, 0.f, 0.f};
            for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *w = col + b * BLOCK_BYTES[fmt];
                const __m256i c = codes32_avx2(fmt, w); /* Q8_0: the signed weights */
                const float dx = _cvtsh_ss(rd16(w)), mx = fmt == F_Q4_1 ? _cvtsh_ss(rd16(w + 2)) : 0.f;
                for (int r = 0; r < mr; r++) {
                    const act32 *a = (const act32 *)act + (mm + r) * nb + b;
                    const __m256i q = _mm256_loadu_si256((const __m256i *)a->q);
                    const __m256i s = fmt == F_Q8_0 ? dot_s8s8_avx2(c, q) : dot_u8s8_avx2(c, q);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dx * a->d), _mm256_cvtepi32_ps(s), acc[r]);
                    if (fmt == F_Q4_1) summs[r] = __builtin_fmaf(mx, a->s, summs[r]);
                }
            }
            for (int r = 0; r < mr; r++) {
                _Alignas(32) float o[8];
                _mm256_store_ps(o, acc[r]);
                y[(mm + r) * ldy + n] = fmt == F_Q4_1 ? hsum8(o) + summs[r] : hsum8(o);
            }
        }
    }
}

T_AVX2 void tile_avx2(int fmt, TILE_ARGS) {
    if (fmt == F_Q4_1) lanes_avx2(F_Q4_1, TILE_PASS);
    else if (fmt == F_Q8_0) lanes_avx2(F_Q8_0, TILE_PASS);
    else tile_avx2_std(fmt, TILE_PASS);
}
#endif /* QMM_X86 */

/* AVX2 column tiles (rows × one column per lane group, lanes over K). */
#include "qmm_cols.h"

#ifdef QMM_X86
#define DOT32_AVX2(fmt, c, q) ((fmt) == F_Q8_0 ? dot_s8s8_avx2(c, q) : dot_u8s8_avx2(c, q))
T_AVX2 INLINE void cols_avx2(const int fmt, TILE_ARGS) { COLS_BODY(codes32_avx2, codesK_avx2, DOT32_AVX2, 1, f16_pairs_avx2) }
SPECIALIZE(tile_avx2, cols_avx2, T_AVX2)
#endif /* QMM_X86 */

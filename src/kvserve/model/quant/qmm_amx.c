/* AMX int8 row tiles: the tile unit computes the exact block dots, the vector units the float side. */
#include "qmm_simd.h"

#ifdef QMM_X86
/* ---- AMX int8 row tiles (32-weight formats): the tile unit computes the exact block dots ----
 * A = 16 columns' codes of one block (16 rows × 32 bytes, unsigned), B = 16 rows' activation codes
 * of the block in the interleaved layout (8 rows × 64 bytes, signed), C[n][r] = the block dot of
 * column n and row r: the same int32 as every other path; the float side is the VNNI row tile's. */

#define T_AMX __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,amx-tile,amx-int8")))

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

/* A: weights 16 × 32 bytes; B: two row groups' activations, 8 × 64; C: two 16 × 16 int32 tiles */
/* K-quants: tile 5 = Q6_K's 16-weight sub-blocks (16 × 16 bytes), tile 6 = their activations (4 × 64) */
static const tilecfg AMX_CFG __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {32, 64, 64, 64, 64, 16, 64},
    .rows = {16, 8, 8, 16, 16, 16, 4},
};

T_AMX static void amx_config(void) { _tile_loadconfig(&AMX_CFG); }

/* a[j][i] (16 × 16) → y[i·ldy + j] for j < nc: a register transpose, one store per row */
T_AMX static inline void store_t16(float a[16][16], float *y, int64_t ldy, int nc) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_load_ps(a[i]);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
    }
    const __mmask16 m = (__mmask16)((1u << nc) - 1);
    for (int i = 0; i < 16; i++) _mm512_mask_storeu_ps(y + i * ldy, m, r[i]);
}

T_AMX INLINE void amx_body(const int fmt, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const void *actx,
                           int64_t g0, int64_t g1, int64_t K, float *y, int64_t ldy) {
    const int64_t nb = K / 32;
    const int z = ZERO_OF[fmt];
    const act32x16 *A = (const act32x16 *)actx;
    _Alignas(64) uint8_t abuf[16][32];
    _Alignas(64) int32_t cbuf[2][2][16][16];
    _Alignas(64) float acc[2][16][16];
    _Alignas(64) float dxs[2][16], mxs[2][16];
    for (int64_t nn = n0; nn < n1; nn += 16) {
        const int nc = n1 - nn < 16 ? (int)(n1 - nn) : 16;
        const uint8_t *col[16];
        _Alignas(64) int32_t cidx[16];
        for (int j = 0; j < 16; j++) {
            col[j] = W + (nn + (j < nc ? j : nc - 1)) * rb;
            cidx[j] = (int32_t)((j < nc ? j : nc - 1) * rb);
        }
        const __m512i vidx = _mm512_load_si512((const void *)cidx);
        for (int64_t g = g0; g < g1; g += 2) {
            const int rt = g1 - g < 2 ? 1 : 2;
            for (int r = 0; r < 2; r++)
                for (int j = 0; j < 16; j++) _mm512_store_ps(acc[r][j], _mm512_setzero_ps());
            /* software-pipelined: the tile unit computes block b while the vector units scale
             * and accumulate block b − 1 (double-buffered dots and scales) */
            for (int64_t b = 0; b <= nb; b++) {
                const int cur = (int)(b & 1), prev = cur ^ 1;
                if (b < nb) {
                    const int64_t off = b * BLOCK_BYTES[fmt];
                    for (int j = 0; j < 16; j++) _mm256_store_si256((__m256i *)abuf[j], codes32_512(fmt, col[j] + off));
                    /* the blocks' d (and m) of the 16 columns: one gather of their first dwords */
                    const __m512i gq = _mm512_i32gather_epi32(vidx, (const void *)(col[0] + off), 1);
                    _mm512_store_ps(dxs[cur], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(gq)));
                    _mm512_store_ps(mxs[cur], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(gq, 16))));
                    _tile_loadd(0, abuf, 32);
                    _tile_loadd(1, A[g * nb + b].q, 64);
                    _tile_zero(3);
                    _tile_dpbusd(3, 0, 1);
                    _tile_stored(3, cbuf[cur][0], 64);
                    if (rt == 2) {
                        _tile_loadd(2, A[(g + 1) * nb + b].q, 64);
                        _tile_zero(4);
                        _tile_dpbusd(4, 0, 2);
                        _tile_stored(4, cbuf[cur][1], 64);
                    }
                }
                if (b == 0) continue;
                for (int r = 0; r < rt; r++) {
                    const act32x16 *a = &A[(g + r) * nb + b - 1];
                    const __m512 dy = _mm512_loadu_ps(a->d);
                    const __m512i zs = _mm512_mullo_epi32(_mm512_loadu_si512((const void *)a->isum), _mm512_set1_epi32(-z));
                    const __m512 sy = _mm512_loadu_ps(a->s);
                    for (int j = 0; j < 16; j++) {
                        const __m512i sv = _mm512_add_epi32(_mm512_load_si512((const void *)cbuf[prev][r][j]), zs);
                        __m512 t = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dxs[prev][j]), dy), _mm512_cvtepi32_ps(sv),
                                                   _mm512_load_ps(acc[r][j]));
                        if (fmt == F_Q4_1 || fmt == F_Q5_1) t = _mm512_fmadd_ps(_mm512_set1_ps(mxs[prev][j]), sy, t);
                        _mm512_store_ps(acc[r][j], t);
                    }
                }
            }
            for (int r = 0; r < rt; r++) store_t16(acc[r], y + 16 * (g + r) * ldy + nn, ldy, nc);
        }
    }
}


/* K-quants: per sub-block, C = the 16 columns' × 16 rows' exact dots on the tile unit, then
 * s += sc·C (and the offsets, the mins) on the vector units; the float side once per super-block */
T_AMX INLINE void amxk_body(const int fmt, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const void *actx,
                            int64_t g0, int64_t g1, int64_t K, float *y, int64_t ldy) {
    const int64_t nb = K / 256;
    const actKx16 *A = (const actKx16 *)actx;
    _Alignas(64) uint8_t abuf[16][16][32]; /* [sub-block][column][codes] (Q6_K: [16][16][16] used) */
    _Alignas(64) int32_t cbuf[2][16][16];
    _Alignas(64) float acc[16][16];
    _Alignas(64) int32_t sacc[16][16], tacc[16][16];
    for (int64_t nn = n0; nn < n1; nn += 16) {
        const int nc = n1 - nn < 16 ? (int)(n1 - nn) : 16;
        const uint8_t *col[16];
        for (int j = 0; j < 16; j++) col[j] = W + (nn + (j < nc ? j : nc - 1)) * rb;
        for (int64_t g = g0; g < g1; g++) {
            for (int j = 0; j < 16; j++) _mm512_store_ps(acc[j], _mm512_setzero_ps());
            for (int64_t b = 0; b < nb; b++) {
                const int64_t off = b * BLOCK_BYTES[fmt];
                const actKx16 *a = &A[g * nb + b];
                _Alignas(64) uint8_t sc[16][16], mn[16][8];
                for (int j = 0; j < 16; j++) {
                    const uint8_t *w = col[j] + off;
                    __m256i cv[8];
                    codesK_512(fmt, w, cv);
                    if (fmt == F_Q6_K) {
                        for (int v = 0; v < 8; v++) { /* vector v = sub-blocks 2v, 2v + 1 */
                            _mm_store_si128((__m128i *)abuf[2 * v][j], _mm256_castsi256_si128(cv[v]));
                            _mm_store_si128((__m128i *)abuf[2 * v + 1][j], _mm256_extracti128_si256(cv[v], 1));
                        }
                        memcpy(sc[j], w + 192, 16);
                    } else {
                        for (int v = 0; v < 8; v++) _mm256_store_si256((__m256i *)abuf[v][j], cv[v]);
                        k_scales(w + 4, sc[j], mn[j]);
                    }
                    _mm512_store_si512((void *)sacc[j], _mm512_setzero_si512());
                }
                if (fmt == F_Q6_K) {
                    /* pipelined: the tile unit computes sub-block sb while sub-block sb − 1 is scaled */
                    for (int sb = 0; sb <= 16; sb++) {
                        if (sb < 16) {
                            _tile_loadd(5, abuf[sb], 32); /* 16 codes per column, rows 32 bytes apart */
                            _tile_loadd(6, a->q[4 * sb], 64);
                            if (sb & 1) {
                                _tile_zero(4);
                                _tile_dpbusd(4, 5, 6);
                                _tile_stored(4, cbuf[1], 64);
                            } else {
                                _tile_zero(3);
                                _tile_dpbusd(3, 5, 6);
                                _tile_stored(3, cbuf[0], 64);
                            }
                        }
                        if (sb == 0) continue;
                        const int p = sb - 1;
                        const __m512i off32 = _mm512_slli_epi32(_mm512_load_si512((const void *)a->bs16[p]), 5);
                        for (int j = 0; j < 16; j++) {
                            const __m512i d = _mm512_sub_epi32(_mm512_load_si512((const void *)cbuf[p & 1][j]), off32);
                            const __m512i sv = _mm512_mullo_epi32(d, _mm512_set1_epi32((int8_t)sc[j][p]));
                            _mm512_store_si512((void *)sacc[j], _mm512_add_epi32(_mm512_load_si512((const void *)sacc[j]), sv));
                        }
                    }
                } else {
                    for (int sb = 0; sb <= 8; sb++) {
                        if (sb < 8) {
                            _tile_loadd(0, abuf[sb], 32);
                            _tile_loadd(1, a->q[8 * sb], 64);
                            if (sb & 1) {
                                _tile_zero(4);
                                _tile_dpbusd(4, 0, 1);
                                _tile_stored(4, cbuf[1], 64);
                            } else {
                                _tile_zero(3);
                                _tile_dpbusd(3, 0, 1);
                                _tile_stored(3, cbuf[0], 64);
                            }
                        }
                        if (sb == 0) continue;
                        const int p = sb - 1;
                        for (int j = 0; j < 16; j++) {
                            const __m512i sv = _mm512_mullo_epi32(_mm512_load_si512((const void *)cbuf[p & 1][j]), _mm512_set1_epi32(sc[j][p]));
                            _mm512_store_si512((void *)sacc[j], _mm512_add_epi32(_mm512_load_si512((const void *)sacc[j]), sv));
                        }
                    }
                    for (int j = 0; j < 16; j++) {
                        __m512i t = _mm512_setzero_si512();
                        for (int sb = 0; sb < 8; sb++)
                            t = _mm512_add_epi32(t, _mm512_mullo_epi32(_mm512_load_si512((const void *)a->bs32[sb]),
                                                                       _mm512_set1_epi32(mn[j][sb])));
                        _mm512_store_si512((void *)tacc[j], t);
                    }
                }
                const __m512 dy = _mm512_loadu_ps(a->d);
                for (int j = 0; j < 16; j++) {
                    const uint8_t *w = col[j] + off;
                    const float dx = _cvtsh_ss(rd16(fmt == F_Q6_K ? w + 208 : w));
                    __m512 t = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dx), dy),
                                               _mm512_cvtepi32_ps(_mm512_load_si512((const void *)sacc[j])), _mm512_load_ps(acc[j]));
                    if (fmt != F_Q6_K)
                        t = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(-_cvtsh_ss(rd16(w + 2))), dy),
                                            _mm512_cvtepi32_ps(_mm512_load_si512((const void *)tacc[j])), t);
                    _mm512_store_ps(acc[j], t);
                }
            }
            store_t16(acc, y + 16 * g * ldy + nn, ldy, nc);
        }
    }
}

T_AMX void tile_amx_rows(int fmt, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const void *actx,
                                int64_t g0, int64_t g1, int64_t K, float *y, int64_t ldy) {
    amx_config();
    switch (fmt) {
    case F_Q4_0: amx_body(F_Q4_0, W, rb, n0, n1, actx, g0, g1, K, y, ldy); break;
    case F_Q4_1: amx_body(F_Q4_1, W, rb, n0, n1, actx, g0, g1, K, y, ldy); break;
    case F_Q5_0: amx_body(F_Q5_0, W, rb, n0, n1, actx, g0, g1, K, y, ldy); break;
    case F_Q5_1: amx_body(F_Q5_1, W, rb, n0, n1, actx, g0, g1, K, y, ldy); break;
    case F_Q8_0: amx_body(F_Q8_0, W, rb, n0, n1, actx, g0, g1, K, y, ldy); break;
    case F_Q4_K: amxk_body(F_Q4_K, W, rb, n0, n1, actx, g0, g1, K, y, ldy); break;
    case F_Q5_K: amxk_body(F_Q5_K, W, rb, n0, n1, actx, g0, g1, K, y, ldy); break;
    default: amxk_body(F_Q6_K, W, rb, n0, n1, actx, g0, g1, K, y, ldy); break;
    }
    _tile_release();
}

int amx_usable(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return 0; /* AMX-TILE, AMX-INT8 */
    /* the kernel lets a process use the tile data only once it asks (ARCH_REQ_XCOMP_PERM) */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}
#endif /* QMM_X86 */

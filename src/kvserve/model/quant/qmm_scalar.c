/* The scalar reference: activation quantizers (llama.cpp's), the interleaved activation layouts
 * of the row-tile kernels, and the scalar tile that every SIMD path matches bit for bit. */
#include "qmm.h"

/* Q8_0 / Q8_1 as llama.cpp's x86 quantize_row_q8_0/q8_1: d = amax/127 (stored as f16),
 * codes round(x · 127/amax) to nearest even, s = f16(d · Σq) */
static void quantize_row_32(const float *x, int64_t k, act32 *out) {
    for (int64_t b = 0; b < k / 32; b++, x += 32) {
        float amax = 0.f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float d = amax / 127.f, id = amax != 0.f ? 127.f / amax : 0.f;
        int32_t sum = 0;
        for (int i = 0; i < 32; i++) {
            int v = nearest_int(x[i] * id);
            out[b].q[i] = (int8_t)v;
            sum += v;
        }
        out[b].d = round_f16(d);
        out[b].s = round_f16(d * (float)sum);
        out[b].isum = sum;
        out[b].pad = 0;
    }
}

/* Q8_K as ggml's quantize_row_q8_K_ref */
static void quantize_row_K(const float *x, int64_t k, actK *out) {
    for (int64_t b = 0; b < k / 256; b++, x += 256) {
        float amax = 0.f, max = 0.f;
        for (int i = 0; i < 256; i++) {
            float ax = fabsf(x[i]);
            if (ax > amax) {
                amax = ax;
                max = x[i];
            }
        }
        memset(&out[b], 0, sizeof(actK));
        if (amax == 0.f) continue;
        const float iscale = -127.f / max;
        for (int i = 0; i < 256; i++) {
            int v = nearest_int(iscale * x[i]);
            out[b].q[i] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += out[b].q[16 * j + i];
            out[b].bsums[j] = (int16_t)s;
        }
        out[b].d = 1.f / iscale;
    }
}

void quantize_rows(int at, const float *x, int64_t m0, int64_t m1, int64_t K, void *act, int isa) {
    const int64_t nb = K / (at == A_Q8_K ? 256 : 32);
    for (int64_t m = m0; m < m1; m++) {
#ifdef QMM_X86
        if (isa >= ISA_AVX512) {
            if (at == A_Q8_K) quantize_row_K_512(x + m * K, K, (actK *)act + m * nb);
            else quantize_row_32_512(x + m * K, K, (act32 *)act + m * nb);
            continue;
        }
#endif
        if (at == A_Q8_K) quantize_row_K(x + m * K, K, (actK *)act + m * nb);
        else quantize_row_32(x + m * K, K, (act32 *)act + m * nb);
    }
}

void interleave_32(const act32 *rows, int64_t nb, int64_t b, act32x16 *o) {
    for (int r = 0; r < 16; r++) {
        const act32 *a = &rows[r * nb + b];
        for (int k = 0; k < 8; k++) memcpy(o->q[k][r], a->q + 4 * k, 4);
        o->d[r] = a->d;
        o->s[r] = a->s;
        o->isum[r] = a->isum;
    }
}

void interleave_K(const actK *rows, int64_t nb, int64_t b, actKx16 *o) {
    for (int r = 0; r < 16; r++) {
        const actK *a = &rows[r * nb + b];
        for (int k = 0; k < 64; k++) memcpy(o->q[k][r], a->q + 4 * k, 4);
        for (int j = 0; j < 16; j++) o->bs16[j][r] = a->bsums[j];
        for (int j = 0; j < 8; j++) o->bs32[j][r] = a->bsums[2 * j] + a->bsums[2 * j + 1];
        o->d[r] = a->d;
    }
}

/* unsigned codes of one 32-weight block */
static inline void codes_32(int fmt, const uint8_t *w, uint8_t *c) {
    const uint8_t *qs;
    uint32_t qh = 0;
    switch (fmt) {
    case F_Q4_0: qs = w + 2; break;
    case F_Q4_1: qs = w + 4; break;
    case F_Q5_0: qh = rd32(w + 2); qs = w + 6; break;
    case F_Q5_1: qh = rd32(w + 4); qs = w + 8; break;
    default: /* Q8_0 */
        for (int i = 0; i < 32; i++) c[i] = (uint8_t)((int8_t)w[2 + i] + 128);
        return;
    }
    for (int i = 0; i < 16; i++) {
        c[i] = (qs[i] & 0x0F) | (((qh >> i) & 1) << 4);
        c[i + 16] = (qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4);
    }
}

/* unsigned codes of one 256-weight K block */
static inline void codes_K(int fmt, const uint8_t *w, uint8_t *c) {
    if (fmt == F_Q6_K) {
        const uint8_t *ql = w, *qh = w + 128;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, c += 128)
            for (int l = 0; l < 32; l++) {
                c[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
                c[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                c[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                c[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        return;
    }
    const uint8_t *qs = fmt == F_Q4_K ? w + 16 : w + 48, *qh = w + 16;
    for (int ch = 0; ch < 4; ch++)
        for (int l = 0; l < 32; l++) {
            c[64 * ch + l] = qs[32 * ch + l] & 0x0F;
            c[64 * ch + 32 + l] = qs[32 * ch + l] >> 4;
        }
    if (fmt == F_Q5_K)
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 32; l++) c[32 * j + l] |= ((qh[l] >> j) & 1) << 4;
}

/* ---- the float side of a block, shared by every path ---- */

static inline float acc_32(int fmt, const uint8_t *w, const act32 *a, int32_t s, float acc) {
    const float dx = f16_to_f32(rd16(w));
    acc = fmaf(dx * a->d, (float)s, acc);
    if (fmt == F_Q4_1 || fmt == F_Q5_1) acc = fmaf(f16_to_f32(rd16(w + 2)), a->s, acc);
    return acc;
}

static inline float dK(int fmt, const uint8_t *w) { return f16_to_f32(rd16(fmt == F_Q6_K ? w + 208 : w)); }

/* ---- scalar reference ---- */

/* ggml_vec_dot_q4_1_q8_1 / _q8_0_q8_0 (x86, AVX2 and up): lane j of 8 sums codes 4j..4j+3 of each
 * block (an exact int32), acc_j = fma(dx·dy, lane_j, acc_j) over the blocks in order; Q4_1 also
 * summs = fma(mx, sy, summs); y = hsum8(acc) + summs */
static void tile_lanes_scalar(int fmt, TILE_ARGS) {
    const int64_t nb = K / 32;
    uint8_t c[32];
    for (int64_t n = n0; n < n1; n++) {
        for (int64_t m = m0; m < m1; m++) {
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, summs = 0.f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *w = W + n * rb + b * BLOCK_BYTES[fmt];
                const act32 *a = (const act32 *)act + m * nb + b;
                codes_32(fmt, w, c);
                const int z = fmt == F_Q8_0 ? 128 : 0;
                const float d = f16_to_f32(rd16(w)) * a->d;
                for (int j = 0; j < 8; j++) {
                    int32_t s = 0;
                    for (int i = 4 * j; i < 4 * j + 4; i++) s += (c[i] - z) * a->q[i];
                    acc[j] = fmaf(d, (float)s, acc[j]);
                }
                if (fmt == F_Q4_1) summs = fmaf(f16_to_f32(rd16(w + 2)), a->s, summs);
            }
            y[m * ldy + n] = fmt == F_Q4_1 ? hsum8(acc) + summs : hsum8(acc); /* Q8_0: no + 0 (−0 stays) */
        }
    }
}

void tile_scalar(int fmt, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const void *act,
                        int64_t m0, int64_t m1, int64_t K, float *y, int64_t ldy) {
    if (lane_fmt(fmt)) {
        tile_lanes_scalar(fmt, TILE_PASS);
        return;
    }
    const int64_t nb = K / BLOCK_W[fmt];
    const int z = ZERO_OF[fmt];
    uint8_t c[256];
    for (int64_t n = n0; n < n1; n++) {
        for (int64_t m = m0; m < m1; m++) {
            float acc = 0.f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *w = W + n * rb + b * BLOCK_BYTES[fmt];
                if (BLOCK_W[fmt] == 32) {
                    const act32 *a = (const act32 *)act + m * nb + b;
                    codes_32(fmt, w, c);
                    int32_t s = 0;
                    for (int i = 0; i < 32; i++) s += c[i] * a->q[i];
                    acc = acc_32(fmt, w, a, s - z * a->isum, acc);
                } else {
                    const actK *a = (const actK *)act + m * nb + b;
                    codes_K(fmt, w, c);
                    const float dy = a->d;
                    if (fmt == F_Q6_K) {
                        const int8_t *sc = (const int8_t *)(w + 192);
                        int32_t s = 0;
                        for (int j = 0; j < 16; j++) {
                            int32_t t = 0;
                            for (int i = 0; i < 16; i++) t += c[16 * j + i] * a->q[16 * j + i];
                            s += sc[j] * (t - 32 * a->bsums[j]);
                        }
                        acc = fmaf(dK(fmt, w) * dy, (float)s, acc);
                    } else {
                        uint8_t sc[8], mn[8];
                        k_scales(w + 4, sc, mn);
                        int32_t s = 0, t = 0;
                        for (int j = 0; j < 8; j++) {
                            int32_t u = 0;
                            for (int i = 0; i < 32; i++) u += c[32 * j + i] * a->q[32 * j + i];
                            s += sc[j] * u;
                            t += mn[j] * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
                        }
                        acc = fmaf(dK(fmt, w) * dy, (float)s, acc);
                        acc = fmaf(-f16_to_f32(rd16(w + 2)) * dy, (float)t, acc);
                    }
                }
            }
            y[m * ldy + n] = acc;
        }
    }
}

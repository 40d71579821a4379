/* The native CPU attention's scalar reference functions (attn_cpu.h): each (row, head) pair on its
 * own, element by element; the AVX-512 functions compute the same bits. */
#include "attn_cpu.h"

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

void item_ref(const item *it, const params *p, float *buf) {
    for (int c = 0; c < it->n; c++) pair_ref(it, c, p, buf, buf + p->D);
}

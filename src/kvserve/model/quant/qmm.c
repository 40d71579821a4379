/* y = x @ W.T straight from GGUF block bytes (kvserve.model.quant._qmm).
 *
 * The arithmetic is llama.cpp's CPU backend's: each row of x is quantized per block to the
 * weight format's activation type (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the
 * K-quants); each block's dot product of weight codes and activation codes is an exact int32,
 * scaled by the blocks' scales and accumulated over the blocks of a row in order, in float32.
 * Every y[m, n] is computed by the same operations in the same order whatever M, the tiling, the
 * thread count or the instruction set (scalar, AVX2, AVX-512 VNNI): the scalar functions below are
 * the reference, the SIMD ones compute the same integers and the same float operations.
 *
 * Per block (dx, mx, dmin: the weight block's f16 fields; dy, sy, bs: the activation block's):
 *   Q4_0, Q5_0, Q8_0   s = Σ c·q − z·Σq (z = 8, 16, 128; c the unsigned code)   acc = fma(dx·dy, s, acc)
 *   Q4_1, Q5_1         s = Σ c·q           acc = fma(dx·dy, s, acc); acc = fma(mx, sy, acc)
 *   Q4_K, Q5_K         s = Σ_j sc_j Σ c·q, t = Σ_j mn_j (bs_2j + bs_2j+1)
 *                      acc = fma(dx·dy, s, acc); acc = fma(−dmin·dy, t, acc)
 *   Q6_K               s = Σ_j sc_j (Σ c·q − 32·bs_j)                        acc = fma(dx·dy, s, acc)
 * (integers converted to float32 once, round to nearest even).
 *
 * Threads: one OpenMP parallel region per call (libgomp by soname: torch's runtime when torch is
 * loaded first), columns split in fixed chunks; rows are never split, so nothing depends on it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#define QMM_X86 1
#include <immintrin.h>
#endif

enum { F_Q4_0, F_Q4_1, F_Q5_0, F_Q5_1, F_Q8_0, F_Q4_K, F_Q5_K, F_Q6_K, F_COUNT };
enum { A_Q8_0, A_Q8_1, A_Q8_K };
enum { ISA_SCALAR, ISA_AVX2, ISA_AVX512 };

static const int BLOCK_BYTES[F_COUNT] = {18, 20, 22, 24, 34, 144, 176, 210};
static const int BLOCK_W[F_COUNT] = {32, 32, 32, 32, 32, 256, 256, 256};
static const int ACT_OF[F_COUNT] = {A_Q8_0, A_Q8_1, A_Q8_0, A_Q8_1, A_Q8_0, A_Q8_K, A_Q8_K, A_Q8_K};
static const int ZERO_OF[F_COUNT] = {8, 0, 16, 0, 128, 0, 0, 0};

/* ---- activation blocks (the kernel's own layout of ggml's block_q8_0 / q8_1 / q8_K) ---- */

typedef struct {
    float d;       /* f16-rounded scale, as float */
    float s;       /* Q8_1: f16(d·Σq); Q8_0: unused */
    int32_t isum;  /* Σq */
    int32_t pad;
    int8_t q[32];
} act32;           /* 48 bytes */

typedef struct {
    float d;
    int32_t pad[3];
    int16_t bsums[16];  /* sums of 16 codes */
    int8_t q[256];
} actK;                 /* 304 bytes */

/* 16 rows of one block interleaved for the AVX-512 row-tile kernel: lane r = row r. */
typedef struct {
    int8_t q[8][16][4];  /* codes 4k..4k+3 of row r at q[k][r] */
    float d[16], s[16];
    int32_t isum[16];
} act32x16;              /* 704 bytes */

typedef struct {
    int8_t q[64][16][4];
    int32_t bs16[16][16];  /* [sub-block of 16][row] */
    int32_t bs32[8][16];   /* [sub-block of 32][row] */
    float d[16];
} actKx16;                 /* 5696 bytes */

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FF) << 13);
        }
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float32 → float16, round to nearest even (as F16C and numpy) */
static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7FFFFFFF;
    if (ax >= 0x7F800000) return (uint16_t)(sign | 0x7C00 | (ax > 0x7F800000 ? 0x200 : 0));
    if (ax >= 0x477FF000) return (uint16_t)(sign | 0x7C00); /* rounds to ≥ 65520: inf */
    if (ax < 0x38800000) {                                   /* f16 subnormal or zero */
        if (ax < 0x33000000) return (uint16_t)sign;          /* < 2^-25: 0 */
        uint32_t e = ax >> 23, m = (ax & 0x7FFFFF) | 0x800000;
        uint32_t shift = 126 - e; /* value = m · 2^(e−150); units of 2^-24 → m >> (126 − e) */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ax - ((uint32_t)(127 - 15) << 23); /* rebias */
    uint32_t h = r >> 13, rem = r & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* round half to even for |v| < 2^22 (ggml's nearest_int) */
static inline int nearest_int(float v) {
    float t = v + 12582912.f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007FFFFF) - 0x00400000;
}

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

static void interleave_32(const act32 *rows, int64_t nb, int64_t b, act32x16 *o) {
    for (int r = 0; r < 16; r++) {
        const act32 *a = &rows[r * nb + b];
        for (int k = 0; k < 8; k++) memcpy(o->q[k][r], a->q + 4 * k, 4);
        o->d[r] = a->d;
        o->s[r] = a->s;
        o->isum[r] = a->isum;
    }
}

static void interleave_K(const actK *rows, int64_t nb, int64_t b, actKx16 *o) {
    for (int r = 0; r < 16; r++) {
        const actK *a = &rows[r * nb + b];
        for (int k = 0; k < 64; k++) memcpy(o->q[k][r], a->q + 4 * k, 4);
        for (int j = 0; j < 16; j++) o->bs16[j][r] = a->bsums[j];
        for (int j = 0; j < 8; j++) o->bs32[j][r] = a->bsums[2 * j] + a->bsums[2 * j + 1];
        o->d[r] = a->d;
    }
}

/* ---- weight blocks: codes and scales ---- */

/* the 12-byte K-quant scale field → 8 six-bit scales and 8 six-bit mins */
static inline void k_scales(const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0F) | ((s[j] >> 2) & 0x30);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
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

static void tile_scalar(int fmt, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const void *act,
                        int64_t m0, int64_t m1, int64_t K, float *y, int64_t ldy) {
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

#ifdef QMM_X86
/* ---- AVX2 (and AVX-512 VNNI on 256-bit vectors): rows × one column, lanes over K ---- */

#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define T_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")))

/* 32 codes of a 32-weight block; q8: signed codes (Q8_0) */
#define CODES32_BODY(HIGH_BITS, Q8_XOR)                                               \
    switch (fmt) {                                                                    \
    case F_Q4_0: qs = w + 2; break;                                                   \
    case F_Q4_1: qs = w + 4; break;                                                   \
    case F_Q5_0: qh = rd32(w + 2); qs = w + 6; break;                                 \
    case F_Q5_1: qh = rd32(w + 4); qs = w + 8; break;                                 \
    default: return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + 2)), _mm256_set1_epi8(Q8_XOR)); \
    }                                                                                 \
    __m128i x = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0F);       \
    __m256i c = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m4), _mm_and_si128(x, m4)); \
    if (fmt == F_Q5_0 || fmt == F_Q5_1) c = _mm256_or_si256(c, HIGH_BITS(qh));        \
    return c;

T_AVX2 static inline __m256i bits_to_bytes_avx2(uint32_t bits) {
    /* byte i = 0x10 where bit i is set */
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)bits),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

T_AVX512 static inline __m256i bits_to_bytes_512(uint32_t bits) {
    return _mm256_maskz_mov_epi8((__mmask32)bits, _mm256_set1_epi8(0x10));
}

T_AVX2 static inline __m256i codes32_avx2(int fmt, const uint8_t *w) {
    const uint8_t *qs;
    uint32_t qh = 0;
    CODES32_BODY(bits_to_bytes_avx2, 0)
}

T_AVX512 static inline __m256i codes32_512(int fmt, const uint8_t *w) {
    const uint8_t *qs;
    uint32_t qh = 0;
    CODES32_BODY(bits_to_bytes_512, (char)0x80)
}

T_AVX2 static inline int32_t hsum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

T_AVX2 static inline __m256i dot_u8s8_avx2(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

T_AVX2 static inline __m256i dot_s8s8_avx2(__m256i a, __m256i b) {
    return dot_u8s8_avx2(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

T_AVX512 static inline __m256i dot_u8s8_512(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

/* 8 sub-block codes of a K block into c[8] (32 codes each); Q6_K: 16 sub-blocks of 16 codes,
 * two per vector */
#define CODESK_BODY(QH_BIT)                                                                   \
    const __m256i m4 = _mm256_set1_epi8(0x0F);                                                \
    if (fmt == F_Q6_K) {                                                                      \
        const __m256i m3 = _mm256_set1_epi8(3);                                               \
        for (int h = 0; h < 2; h++) {                                                         \
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(w + 64 * h));                   \
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));              \
            __m256i hb = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));             \
            c[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4),                          \
                                           _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4));   \
            c[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4),                          \
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4));        \
            c[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),    \
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4));        \
            c[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),    \
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4));        \
        }                                                                                     \
        return;                                                                               \
    }                                                                                         \
    const uint8_t *qs = fmt == F_Q4_K ? w + 16 : w + 48;                                      \
    for (int ch = 0; ch < 4; ch++) {                                                          \
        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * ch));                      \
        c[2 * ch] = _mm256_and_si256(v, m4);                                                  \
        c[2 * ch + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);                        \
    }                                                                                         \
    if (fmt == F_Q5_K) {                                                                      \
        __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 16));                           \
        for (int j = 0; j < 8; j++) c[j] = _mm256_or_si256(c[j], QH_BIT(qh, j));              \
    }

T_AVX2 static inline __m256i qh_bit_avx2(__m256i qh, int j) {
    const __m256i bit = _mm256_set1_epi8((char)(1 << j));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), _mm256_set1_epi8(0x10));
}

T_AVX512 static inline __m256i qh_bit_512(__m256i qh, int j) {
    return _mm256_maskz_mov_epi8(_mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << j))),
                                 _mm256_set1_epi8(0x10));
}

T_AVX2 static inline void codesK_avx2(int fmt, const uint8_t *w, __m256i *c) { CODESK_BODY(qh_bit_avx2) }
T_AVX512 static inline void codesK_512(int fmt, const uint8_t *w, __m256i *c) { CODESK_BODY(qh_bit_512) }

/* lane j = the sum of the 8 lanes of v[j] */
T_AVX2 static inline __m256i reduce8(const __m256i *v) {
    const __m256i ab = _mm256_hadd_epi32(v[0], v[1]), cd = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i ef = _mm256_hadd_epi32(v[4], v[5]), gh = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i x = _mm256_hadd_epi32(ab, cd), y = _mm256_hadd_epi32(ef, gh);
    return _mm256_add_epi32(_mm256_permute2x128_si256(x, y, 0x20), _mm256_permute2x128_si256(x, y, 0x31));
}

#define LOAD_F16X8(p) _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(p)))
#define NEG(v) _mm256_xor_ps(v, _mm256_set1_ps(-0.f))

/* rows [m0, m1) × columns [n0, n1): lanes over K, 8 columns at a time (their block dots reduced
 * into the 8 lanes of one vector, so the float side runs per column lane); each block's codes
 * decoded once for up to 16 rows. K-quant sub-blocks: u8·s8 pairs (maddubs, exact for codes
 * < 64) times the int16 sub-scales (madd). */
#define COLS_BODY(CODES32, CODESK, DOT32, SIGNED_Q8)                                                  \
    const int64_t nb = K / BLOCK_W[fmt];                                                               \
    const int z = ZERO_OF[fmt];                                                                        \
    __m256 acc[16];                                                                                    \
    __m256i part[16][8], tpart[16][8];                                                                 \
    for (int64_t n = n0; n < n1; n += 8) {                                                             \
        const int nc = n1 - n < 8 ? (int)(n1 - n) : 8;                                                 \
        const uint8_t *col[8];                                                                         \
        for (int j = 0; j < 8; j++) col[j] = W + (n + (j < nc ? j : nc - 1)) * rb; /* pad: repeat */   \
        for (int64_t mm = m0; mm < m1; mm += 16) {                                                     \
            const int mr = m1 - mm < 16 ? (int)(m1 - mm) : 16;                                         \
            for (int r = 0; r < mr; r++) acc[r] = _mm256_setzero_ps();                                 \
            for (int64_t b = 0; b < nb; b++) {                                                         \
                const int64_t off = b * BLOCK_BYTES[fmt];                                              \
                _Alignas(16) uint16_t f0[8], f1[8];                                                    \
                if (BLOCK_W[fmt] == 32) {                                                              \
                    __m256i c[8];                                                                      \
                    for (int j = 0; j < 8; j++) {                                                      \
                        c[j] = CODES32(fmt, col[j] + off);                                             \
                        f0[j] = rd16(col[j] + off);                                                    \
                        f1[j] = rd16(col[j] + off + 2);                                                \
                    }                                                                                  \
                    const __m256 dx = LOAD_F16X8(f0), mx = LOAD_F16X8(f1);                             \
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
                            f0[j] = rd16(w + 208);                                                     \
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
                            f0[j] = rd16(w);                                                           \
                            f1[j] = rd16(w + 2);                                                       \
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
                    const __m256 dx = LOAD_F16X8(f0);                                                  \
                    for (int r = 0; r < mr; r++) {                                                     \
                        const actK *a = (const actK *)act + (mm + r) * nb + b;                         \
                        const __m256 dy = _mm256_set1_ps(a->d);                                        \
                        __m256 t = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(reduce8(part[r])), acc[r]); \
                        if (fmt != F_Q6_K)                                                             \
                            t = _mm256_fmadd_ps(_mm256_mul_ps(NEG(LOAD_F16X8(f1)), dy),                \
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

#define TILE_ARGS const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const void *act, int64_t m0, int64_t m1, \
                  int64_t K, float *y, int64_t ldy
#define TILE_PASS W, rb, n0, n1, act, m0, m1, K, y, ldy
/* one copy of an always-inlined body per format: the format's branches fold away */
#define SPECIALIZE(NAME, IMPL, TARGET)                                                  \
    TARGET static void NAME(int fmt, TILE_ARGS) {                                       \
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

#define INLINE static inline __attribute__((always_inline))

#define DOT32_AVX2(fmt, c, q) ((fmt) == F_Q8_0 ? dot_s8s8_avx2(c, q) : dot_u8s8_avx2(c, q))
#define DOT32_512(fmt, c, q) dot_u8s8_512(c, q)
T_AVX2 INLINE void cols_avx2(const int fmt, TILE_ARGS) { COLS_BODY(codes32_avx2, codesK_avx2, DOT32_AVX2, 1) }
SPECIALIZE(tile_avx2, cols_avx2, T_AVX2)

T_AVX512 INLINE void cols_512(const int fmt, TILE_ARGS) { COLS_BODY(codes32_512, codesK_512, DOT32_512, 0) }
SPECIALIZE(tile_512_cols, cols_512, T_AVX512)

/* ---- AVX-512 VNNI row tiles: 16 rows in the lanes of a vector, weights broadcast ---- */

#define NT 8 /* columns per row tile */

T_AVX512 INLINE void rows_512(const int fmt, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1,
                              const void *actx, int64_t g, int64_t K, float *y, int64_t ldy) {
    /* rows [16g, 16g + 16) × columns [n0, n1), n1 − n0 ≤ NT */
    const int64_t nb = K / BLOCK_W[fmt];
    const int nc = (int)(n1 - n0);
    __m512 acc[NT];
    for (int j = 0; j < NT; j++) acc[j] = _mm512_setzero_ps();
    _Alignas(64) uint8_t c[256];
    if (BLOCK_W[fmt] == 32) {
        const act32x16 *A = (const act32x16 *)actx + g * nb;
        const int z = ZERO_OF[fmt];
        for (int64_t b = 0; b < nb; b++) {
            const act32x16 *a = &A[b];
            __m512i q[8];
            for (int k = 0; k < 8; k++) q[k] = _mm512_load_si512((const void *)a->q[k]);
            const __m512 dy = _mm512_loadu_ps(a->d);
            const __m512i zs = _mm512_mullo_epi32(_mm512_loadu_si512((const void *)a->isum), _mm512_set1_epi32(-z));
            for (int j = 0; j < nc; j++) {
                const uint8_t *w = W + (n0 + j) * rb + b * BLOCK_BYTES[fmt];
                _mm256_store_si256((__m256i *)c, codes32_512(fmt, w));
                __m512i s = zs, s1 = _mm512_setzero_si512(); /* two chains: VNNI latency */
                for (int k = 0; k < 8; k += 2) {
                    s = _mm512_dpbusd_epi32(s, _mm512_set1_epi32(((const int32_t *)c)[k]), q[k]);
                    s1 = _mm512_dpbusd_epi32(s1, _mm512_set1_epi32(((const int32_t *)c)[k + 1]), q[k + 1]);
                }
                s = _mm512_add_epi32(s, s1);
                const __m512 dd = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(rd16(w))), dy);
                acc[j] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(s), acc[j]);
                if (fmt == F_Q4_1 || fmt == F_Q5_1)
                    acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(rd16(w + 2))), _mm512_loadu_ps(a->s), acc[j]);
            }
        }
    } else {
        const actKx16 *A = (const actKx16 *)actx + g * nb;
        for (int64_t b = 0; b < nb; b++) {
            const actKx16 *a = &A[b];
            const __m512 dy = _mm512_loadu_ps(a->d);
            for (int j = 0; j < nc; j++) {
                const uint8_t *w = W + (n0 + j) * rb + b * BLOCK_BYTES[fmt];
                __m256i cv[8];
                codesK_512(fmt, w, cv);
                for (int v = 0; v < 8; v++) _mm256_store_si256((__m256i *)(c + 32 * v), cv[v]);
                const int32_t *c4 = (const int32_t *)c;
                __m512i s = _mm512_setzero_si512();
                const float dx = _cvtsh_ss(rd16(fmt == F_Q6_K ? w + 208 : w));
                if (fmt == F_Q6_K) {
                    const int8_t *sc = (const int8_t *)(w + 192);
                    for (int sb = 0; sb < 16; sb++) {
                        __m512i t = _mm512_mullo_epi32(_mm512_load_si512((const void *)a->bs16[sb]), _mm512_set1_epi32(-32));
                        for (int k = 0; k < 4; k++)
                            t = _mm512_dpbusd_epi32(t, _mm512_set1_epi32(c4[4 * sb + k]), _mm512_load_si512((const void *)a->q[4 * sb + k]));
                        s = _mm512_add_epi32(s, _mm512_mullo_epi32(t, _mm512_set1_epi32(sc[sb])));
                    }
                    acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dx), dy), _mm512_cvtepi32_ps(s), acc[j]);
                } else {
                    uint8_t sc[8], mn[8];
                    k_scales(w + 4, sc, mn);
                    __m512i t = _mm512_setzero_si512();
                    for (int sb = 0; sb < 8; sb++) {
                        __m512i u = _mm512_setzero_si512(), u1 = _mm512_setzero_si512();
                        for (int k = 0; k < 8; k += 2) {
                            u = _mm512_dpbusd_epi32(u, _mm512_set1_epi32(c4[8 * sb + k]), _mm512_load_si512((const void *)a->q[8 * sb + k]));
                            u1 = _mm512_dpbusd_epi32(u1, _mm512_set1_epi32(c4[8 * sb + k + 1]), _mm512_load_si512((const void *)a->q[8 * sb + k + 1]));
                        }
                        u = _mm512_add_epi32(u, u1);
                        s = _mm512_add_epi32(s, _mm512_mullo_epi32(u, _mm512_set1_epi32(sc[sb])));
                        t = _mm512_add_epi32(t, _mm512_mullo_epi32(_mm512_load_si512((const void *)a->bs32[sb]), _mm512_set1_epi32(mn[sb])));
                    }
                    const float dmin = _cvtsh_ss(rd16(w + 2));
                    __m512 r = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dx), dy), _mm512_cvtepi32_ps(s), acc[j]);
                    acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(-dmin), dy), _mm512_cvtepi32_ps(t), r);
                }
            }
        }
    }
    for (int j = 0; j < nc; j++) {
        _Alignas(64) float o[16];
        _mm512_store_ps(o, acc[j]);
        for (int r = 0; r < 16; r++) y[(16 * g + r) * ldy + n0 + j] = o[r];
    }
}
T_AVX512 static void tile_512_rows(int fmt, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1,
                                   const void *actx, int64_t g, int64_t K, float *y, int64_t ldy) {
    switch (fmt) {
    case F_Q4_0: rows_512(F_Q4_0, W, rb, n0, n1, actx, g, K, y, ldy); break;
    case F_Q4_1: rows_512(F_Q4_1, W, rb, n0, n1, actx, g, K, y, ldy); break;
    case F_Q5_0: rows_512(F_Q5_0, W, rb, n0, n1, actx, g, K, y, ldy); break;
    case F_Q5_1: rows_512(F_Q5_1, W, rb, n0, n1, actx, g, K, y, ldy); break;
    case F_Q8_0: rows_512(F_Q8_0, W, rb, n0, n1, actx, g, K, y, ldy); break;
    case F_Q4_K: rows_512(F_Q4_K, W, rb, n0, n1, actx, g, K, y, ldy); break;
    case F_Q5_K: rows_512(F_Q5_K, W, rb, n0, n1, actx, g, K, y, ldy); break;
    default: rows_512(F_Q6_K, W, rb, n0, n1, actx, g, K, y, ldy); break;
    }
}
#endif /* QMM_X86 */

static int best_isa(void) {
#ifdef QMM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return ISA_AVX2;
#endif
    return ISA_SCALAR;
}

#define COL_CHUNK 16

/* y[m, n] (row stride ldy) for rows [0, M), columns [0, N) */
static void qmm(int fmt, const float *x, int64_t M, int64_t K, const uint8_t *W, int64_t N, float *y, int64_t ldy,
                int nthreads, int isa) {
    const int at = ACT_OF[fmt];
    const int64_t bw = at == A_Q8_K ? 256 : 32, nb = K / bw, rb = nb * BLOCK_BYTES[fmt];
    const size_t abytes = at == A_Q8_K ? sizeof(actK) : sizeof(act32);
    const size_t xbytes = at == A_Q8_K ? sizeof(actKx16) : sizeof(act32x16);
    const int64_t groups = isa == ISA_AVX512 ? M / 16 : 0;
    void *act = aligned_alloc(64, ((size_t)(M * nb * abytes) + 63) / 64 * 64 + 64);
    void *actx = groups ? aligned_alloc(64, (size_t)(groups * nb) * xbytes + 64) : NULL;
    const int64_t nchunks = (N + COL_CHUNK - 1) / COL_CHUNK;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > 1 && M * K * N < (1 << 16)) nthreads = 1;
#pragma omp parallel num_threads(nthreads)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) {
            if (at == A_Q8_K)
                quantize_row_K(x + m * K, K, (actK *)act + m * nb);
            else
                quantize_row_32(x + m * K, K, (act32 *)act + m * nb);
        }
        if (groups) {
#pragma omp for schedule(static)
            for (int64_t gb = 0; gb < groups * nb; gb++) {
                const int64_t g = gb / nb, b = gb % nb;
                if (at == A_Q8_K)
                    interleave_K((const actK *)act + 16 * g * nb, nb, b, (actKx16 *)actx + gb);
                else
                    interleave_32((const act32 *)act + 16 * g * nb, nb, b, (act32x16 *)actx + gb);
            }
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t ch = 0; ch < nchunks; ch++) {
            const int64_t n0 = ch * COL_CHUNK, n1 = n0 + COL_CHUNK < N ? n0 + COL_CHUNK : N;
            const int64_t mrest = 16 * groups;
#ifdef QMM_X86
            if (isa == ISA_AVX512) {
                for (int64_t g = 0; g < groups; g++)
                    for (int64_t j = n0; j < n1; j += NT)
                        tile_512_rows(fmt, W, rb, j, j + NT < n1 ? j + NT : n1, actx, g, K, y, ldy);
                if (mrest < M) tile_512_cols(fmt, W, rb, n0, n1, act, mrest, M, K, y, ldy);
            } else if (isa == ISA_AVX2) {
                tile_avx2(fmt, W, rb, n0, n1, act, 0, M, K, y, ldy);
            } else
#endif
                tile_scalar(fmt, W, rb, n0, n1, act, 0, M, K, y, ldy);
        }
    }
    free(act);
    free(actx);
}

/* ---- Python ---- */

static PyObject *py_matmul(PyObject *self, PyObject *args) {
    int fmt, nthreads, isa;
    unsigned long long xp, wp, yp;
    long long M, K, N, ldy;
    if (!PyArg_ParseTuple(args, "iKLLKLKLii", &fmt, &xp, &M, &K, &wp, &N, &yp, &ldy, &nthreads, &isa)) return NULL;
    if (fmt < 0 || fmt >= F_COUNT || K % BLOCK_W[fmt] || M < 0 || N < 0) {
        PyErr_SetString(PyExc_ValueError, "qmm.matmul: bad format or shape");
        return NULL;
    }
    const int best = best_isa();
    if (isa < 0 || isa > best) isa = best;
    Py_BEGIN_ALLOW_THREADS
    qmm(fmt, (const float *)xp, M, K, (const uint8_t *)wp, N, (float *)yp, ldy, nthreads, isa);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_best_isa(PyObject *self, PyObject *args) { return PyLong_FromLong(best_isa()); }

static PyObject *py_quantize(PyObject *self, PyObject *args) {
    /* the activation blocks of x (for tests): Q8_0/Q8_1 → act32 rows, Q8_K → actK rows */
    int fmt;
    unsigned long long xp, op;
    long long M, K;
    if (!PyArg_ParseTuple(args, "iKLLK", &fmt, &xp, &M, &K, &op)) return NULL;
    if (fmt < 0 || fmt >= F_COUNT || K % BLOCK_W[fmt]) {
        PyErr_SetString(PyExc_ValueError, "qmm.quantize: bad format or shape");
        return NULL;
    }
    const int64_t nb = K / (ACT_OF[fmt] == A_Q8_K ? 256 : 32);
    for (int64_t m = 0; m < M; m++) {
        if (ACT_OF[fmt] == A_Q8_K)
            quantize_row_K((const float *)xp + m * K, K, (actK *)op + m * nb);
        else
            quantize_row_32((const float *)xp + m * K, K, (act32 *)op + m * nb);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"matmul", py_matmul, METH_VARARGS,
     "matmul(fmt, x_ptr, M, K, w_ptr, N, y_ptr, ldy, nthreads, isa): y[:, :N] = x @ W.T (float32)"},
    {"best_isa", py_best_isa, METH_NOARGS, "0 scalar, 1 AVX2, 2 AVX-512 VNNI: the best this CPU runs"},
    {"quantize", py_quantize, METH_VARARGS, "quantize(fmt, x_ptr, M, K, out_ptr): activation blocks (tests)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_qmm", NULL, -1, methods};

PyMODINIT_FUNC PyInit__qmm(void) { return PyModule_Create(&module); }

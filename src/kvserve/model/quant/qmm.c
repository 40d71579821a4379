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
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

enum { F_Q4_0, F_Q4_1, F_Q5_0, F_Q5_1, F_Q8_0, F_Q4_K, F_Q5_K, F_Q6_K, F_COUNT };
enum { A_Q8_0, A_Q8_1, A_Q8_K };
enum { ISA_SCALAR, ISA_AVX2, ISA_AVX512, ISA_AMX };

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


#ifdef QMM_X86
/* the same activation blocks with AVX-512 (bit for bit: max and the first maximum's index are
 * order-free, products and round-to-nearest-even conversions are elementwise) */
__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
static void quantize_row_32_512(const float *x, int64_t k, act32 *out) {
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
static void quantize_row_K_512(const float *x, int64_t k, actK *out) {
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
#endif

static void quantize_rows(int at, const float *x, int64_t m0, int64_t m1, int64_t K, void *act, int isa) {
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

/* the two f16 fields of a dword at base + idx[j] (lanes j) → float32 (low half, high half) */
T_AVX2 static inline void f16_pairs_avx2(const uint8_t *base, __m256i idx, __m256 *lo, __m256 *hi) {
    const __m256i g = _mm256_i32gather_epi32((const int *)base, idx, 1), m = _mm256_set1_epi32(0xFFFF);
    const __m256i p = _mm256_permute4x64_epi64(
        _mm256_packus_epi32(_mm256_and_si256(g, m), _mm256_srli_epi32(g, 16)), 0xD8); /* [lo 8 | hi 8] */
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(p));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(p, 1));
}

T_AVX512 static inline void f16_pairs_512(const uint8_t *base, __m256i idx, __m256 *lo, __m256 *hi) {
    const __m256i g = _mm256_i32gather_epi32((const int *)base, idx, 1);
    *lo = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(g));
    *hi = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(g, 16)));
}

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
T_AVX2 INLINE void cols_avx2(const int fmt, TILE_ARGS) { COLS_BODY(codes32_avx2, codesK_avx2, DOT32_AVX2, 1, f16_pairs_avx2) }
SPECIALIZE(tile_avx2, cols_avx2, T_AVX2)

T_AVX512 INLINE void cols_512(const int fmt, TILE_ARGS) { COLS_BODY(codes32_512, codesK_512, DOT32_512, 0, f16_pairs_512) }
SPECIALIZE(tile_512_cols, cols_512, T_AVX512)

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

/* row groups [g0, g1) × columns [n0, n1) */
T_AVX512 static void tile_512_rows(int fmt, const uint8_t *W, int64_t rb, int64_t n0_, int64_t n1_,
                                   const void *actx, int64_t g0_, int64_t g1, int64_t K, float *y, int64_t ldy) {
    for (int64_t n0 = n0_; n0 < n1_; n0 += NT) {
        const int64_t n1 = n0 + NT < n1_ ? n0 + NT : n1_;
        int64_t g0 = g0_;
        for (; g0 + 4 <= g1; g0 += 4) { ROWS_SWITCH(rows4_512) }
        for (; g0 < g1; g0++) { ROWS_SWITCH(rows1_512) }
    }
}

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

T_AMX static void tile_amx_rows(int fmt, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const void *actx,
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

static int amx_usable(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return 0; /* AMX-TILE, AMX-INT8 */
    /* the kernel lets a process use the tile data only once it asks (ARCH_REQ_XCOMP_PERM) */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}
#endif /* QMM_X86 */

static int best_isa(void) {
#ifdef QMM_X86
    static int amx = -1;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        if (amx < 0) amx = amx_usable();
        return amx ? ISA_AMX : ISA_AVX512;
    }
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
    const int64_t groups = isa >= ISA_AVX512 ? M / 16 : 0;
    void *act = aligned_alloc(64, ((size_t)(M * nb * abytes) + 63) / 64 * 64 + 64);
    void *actx = groups ? aligned_alloc(64, (size_t)(groups * nb) * xbytes + 64) : NULL;
    const int64_t nchunks = (N + COL_CHUNK - 1) / COL_CHUNK;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > 1 && M * K * N < (1 << 16)) nthreads = 1;
#pragma omp parallel num_threads(nthreads)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) quantize_rows(at, x, m, m + 1, K, act, isa);
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
#pragma omp for schedule(static) /* contiguous columns per thread: the prefetches run ahead in them */
        for (int64_t ch = 0; ch < nchunks; ch++) {
            const int64_t n0 = ch * COL_CHUNK, n1 = n0 + COL_CHUNK < N ? n0 + COL_CHUNK : N;
            const int64_t mrest = 16 * groups;
#ifdef QMM_X86
            if (isa == ISA_AMX) {
                if (groups) tile_amx_rows(fmt, W, rb, n0, n1, actx, 0, groups, K, y, ldy);
                if (mrest < M) tile_512_cols(fmt, W, rb, n0, n1, act, mrest, M, K, y, ldy);
            } else if (isa >= ISA_AVX512) {
                if (groups) tile_512_rows(fmt, W, rb, n0, n1, actx, 0, groups, K, y, ldy);
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
    int fmt, isa = -1;
    unsigned long long xp, op;
    long long M, K;
    if (!PyArg_ParseTuple(args, "iKLLK|i", &fmt, &xp, &M, &K, &op, &isa)) return NULL;
    if (fmt < 0 || fmt >= F_COUNT || K % BLOCK_W[fmt]) {
        PyErr_SetString(PyExc_ValueError, "qmm.quantize: bad format or shape");
        return NULL;
    }
    const int best = best_isa();
    if (isa < 0 || isa > best) isa = best;
    quantize_rows(ACT_OF[fmt], (const float *)xp, 0, M, K, (void *)op, isa);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"matmul", py_matmul, METH_VARARGS,
     "matmul(fmt, x_ptr, M, K, w_ptr, N, y_ptr, ldy, nthreads, isa): y[:, :N] = x @ W.T (float32)"},
    {"best_isa", py_best_isa, METH_NOARGS, "0 scalar, 1 AVX2, 2 AVX-512 VNNI, 3 AMX int8: the best this CPU runs"},
    {"quantize", py_quantize, METH_VARARGS, "quantize(fmt, x_ptr, M, K, out_ptr[, isa]): activation blocks (tests)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_qmm", NULL, -1, methods};

PyMODINIT_FUNC PyInit__qmm(void) { return PyModule_Create(&module); }

/* The native kernels' shared internal header: block layouts, the format tables, the scalar
 * helpers every path uses and the entry points of each instruction set's file (qmm.c says how
 * the arithmetic goes; qmm_scalar.c is the reference every other path matches bit for bit).
 *
 *   qmm.c          Python module, ISA detection, the threaded driver (quantize, interleave, tiles)
 *   qmm_scalar.c   activation quantizers (scalar), the interleaved layouts, the scalar tile
 *   qmm_avx2.c     AVX2 column tiles (qmm_simd.h's decoders, qmm_cols.h's body)
 *   qmm_avx512.c   AVX-512 activation quantizers, AVX-512 VNNI column and row tiles
 *   qmm_amx.c      AMX int8 row tiles
 */
#ifndef KVSERVE_QMM_H
#define KVSERVE_QMM_H

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

#define INLINE static inline __attribute__((always_inline))

/* Formats whose float side is ggml's x86 vec_dot lanes (qmm.c): Q4_1 × Q8_1 and Q8_0 × Q8_0 */
static inline int lane_fmt(int fmt) { return fmt == F_Q4_1 || fmt == F_Q8_0; }

/* ggml's hsum_float_8: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) */
static inline float hsum8(const float *a) {
    const float r0 = a[4] + a[0], r1 = a[5] + a[1], r2 = a[6] + a[2], r3 = a[7] + a[3];
    return (r0 + r2) + (r1 + r3);
}

#ifdef QMM_X86
#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define T_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")))
#endif

/* ---- entry points (internal to the extension) ---- */

#pragma GCC visibility push(hidden)

#define TILE_ARGS const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const void *act, int64_t m0, int64_t m1, \
                  int64_t K, float *y, int64_t ldy
#define TILE_PASS W, rb, n0, n1, act, m0, m1, K, y, ldy

/* qmm_scalar.c */
void quantize_rows(int at, const float *x, int64_t m0, int64_t m1, int64_t K, void *act, int isa);
void interleave_32(const act32 *rows, int64_t nb, int64_t b, act32x16 *o);
void interleave_K(const actK *rows, int64_t nb, int64_t b, actKx16 *o);
void tile_scalar(int fmt, TILE_ARGS);

#ifdef QMM_X86
/* qmm_avx2.c: rows [m0, m1) × columns [n0, n1) */
void tile_avx2(int fmt, TILE_ARGS);
/* qmm_avx512.c; tile_512_rows: row groups of 16 [g0, g1) of the interleaved activations */
void quantize_row_32_512(const float *x, int64_t k, act32 *out);
void quantize_row_K_512(const float *x, int64_t k, actK *out);
void tile_512_cols(int fmt, TILE_ARGS);
void tile_512_rows(int fmt, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const void *actx, int64_t g0,
                   int64_t g1, int64_t K, float *y, int64_t ldy);
/* qmm_amx.c */
void tile_amx_rows(int fmt, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const void *actx, int64_t g0,
                   int64_t g1, int64_t K, float *y, int64_t ldy);
int amx_usable(void);
#endif

#pragma GCC visibility pop

#endif /* KVSERVE_QMM_H */

/* The native CPU attention's shared definitions (attn_cpu.c: the module and driver; attn_scalar.c:
 * the reference functions; attn_avx512.c: AVX-512 and AVX512-FP16, the same bits). */
#ifndef KVSERVE_ATTN_CPU_H
#define KVSERVE_ATTN_CPU_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#define ATTN_X86 1
#include <immintrin.h>
#endif

/* ---- float16 <-> float32, round to nearest even (what F16C does) ---- */

static inline float h2f(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    uint32_t bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) {
        if (m == 0) {
            bits = sign;
        } else { /* subnormal: m * 2^-24, exact in float32 */
            float f = (float)m * 0x1p-24f;
            memcpy(&bits, &f, 4);
            bits |= sign;
        }
    } else {
        bits = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0); /* inf, nan */
    if (ax >= 0x477ff000u) return sign | 0x7c00;                                   /* rounds to inf */
    if (ax < 0x38800000u) { /* result subnormal or zero: round ax * 2^24 to an integer */
        float a;
        memcpy(&a, &ax, 4);
        const float r = a * 0x1p24f; /* exact (a power of two) */
        /* round half to even of r (< 1024) */
        const float fl = floorf(r), d = r - fl;
        uint32_t m = (uint32_t)fl;
        if (d > 0.5f || (d == 0.5f && (m & 1))) m++;
        return sign | (uint16_t)m;
    }
    uint32_t m = ax + 0xc8000fffu + ((ax >> 13) & 1); /* rebias exponent by -112, round (RNE) */
    return sign | (uint16_t)(m >> 13);
}

static inline float r16(float f) { return h2f(f2h(f)); }

/* a double rounded to float16 once (round to nearest even) */
static inline float d2h_f(double x) {
    const double a = fabs(x);
    if (a >= 65520.0) return x < 0 ? -INFINITY : INFINITY;
    double r;
    if (a < 0x1p-14) { /* subnormal: a multiple of 2^-24 */
        r = nearbyint(a * 0x1p24) * 0x1p-24;
    } else {
        int e;
        frexp(a, &e); /* a in [2^(e-1), 2^e): 11 significant bits */
        r = ldexp(nearbyint(ldexp(a, 11 - e)), e - 11);
    }
    return (float)(x < 0 ? -r : r);
}

/* float16 arithmetic of the accumulator (llama.cpp's AVX512-FP16 build, for head sizes >= 128):
 * acc = fma16(v, f16(vs), acc) and acc = acc * f16(ms), one float16 rounding each; the product
 * of two float16 values is exact in float32 and, beside a float16 addend of these magnitudes
 * (|v·vs| <= 65504), the sum is exact in double */
static inline float fma16(float v, float w16, float acc) { return d2h_f((double)v * (double)w16 + (double)acc); }

/* ---- one item: rows [t0, t0 + R) of one sequence and the G query heads of one kv head ---- */

#define MAX_CHAINS 32 /* R * G (row, head) pairs of an item */
#define MAX_ROWS 4
#define KB_MAX 32 /* keys per block (the AVX-512 functions) */

typedef struct {
    const float *q[MAX_CHAINS];   /* each pair's query, D floats */
    float *out[MAX_CHAINS];
    int64_t lo[MAX_CHAINS], hi[MAX_CHAINS]; /* each pair's key positions [lo, hi) */
    int n;                        /* pairs */
    int64_t lo_all, hi_all;       /* the union of their key ranges */
    const char *k, *v;            /* cache bases of this kv head: element (row r, d) at base + (r * rs + d) * es */
    int64_t rs;                   /* cache row stride in elements */
    const int64_t *table;
    int64_t ps;
} item;

typedef struct {
    int64_t D;
    int f16;     /* K and V float16 (else float32) */
    int64_t n16; /* float16 KV: the first n16 elements accumulate in float16 arithmetic (below) */
    int fp16;    /* ...with the CPU's float16 instructions (AVX512-FP16), else emulated */
    float scale, softcap;
} params;

static inline float ld(const char *base, int64_t i, int f16) {
    return f16 ? h2f(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

static inline float score(float s, const params *p) {
    s = s * p->scale;
    if (p->softcap != 0.0f) s = p->softcap * tanhf(s);
    return s;
}

/* the scalar reference: each pair on its own */

/* an item's (row, head) pairs, each on its own (buf: 2 * D floats) */
void item_ref(const item *it, const params *p, float *buf);
/* the same, pairs walking the keys together (D a multiple of 64; buf: work_floats(D)) */
void item_512(const item *it, const params *p, float *buf);
int has_512(void);  /* AVX-512 F/DQ with FMA and F16C */
int has_fp16(void); /* and AVX512-FP16 */

static inline size_t work_floats(int64_t D) { return (size_t)(2 * MAX_CHAINS * D + 2 * KB_MAX * D + 16); }

#endif

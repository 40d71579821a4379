/* x86 vector helpers shared by the AVX2, AVX-512 VNNI and AMX files: weight codes decoded
 * into bytes, the u8·s8 block dots, lane reductions and the f16 scale gathers (one body per
 * helper, instantiated per instruction set). */
#ifndef KVSERVE_QMM_SIMD_H
#define KVSERVE_QMM_SIMD_H

#include "qmm.h"

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


#endif /* KVSERVE_QMM_SIMD_H */

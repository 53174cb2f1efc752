/* runtime/core/f16_convert.c: bulk f32 <-> f16 conversions over contiguous arrays, for the
 * CPU copy kernel (casts, copies across dtypes) and the fp16 compress hooks.
 *
 * Note [f16 bulk conversion]: with F16C (the default -march=x86-64-v3) 8 elements at a time
 * through VCVTPS2PH / VCVTPH2PS, else the scalar ddp_f32_to_f16 / ddp_f16_to_f32 per
 * element; the bits are those of the scalar functions in every case:
 *   f32 -> f16: VCVTPS2PH with the rounding in the immediate (round to nearest even, MXCSR's
 *     mode and FTZ not consulted) gives the scalar function's bits for every one of the 2^32
 *     inputs (checked exhaustively when this was written): overflow to Inf, subnormal
 *     results, NaN quieted with its top payload bits kept, signs of zeros.
 *   f16 -> f32: VCVTPH2PS quiets signalling NaNs (sets bit 22) where the scalar function
 *     keeps the payload as it is; those lanes (exponent 31, bit 9 clear, payload not zero)
 *     get bit 22 cleared again, so all 65536 inputs give the scalar bits.
 * spec/core/f16_convert_spec.lua compares both paths over all f16 values and random f32s. */
#include "core/core.h"

#ifdef __F16C__
#include <immintrin.h>

/* 8 f16 -> 8 f32, with the scalar function's signalling NaNs. */
static inline __m256 f16x8_to_f32(__m128i h) {
  __m256 f = _mm256_cvtph_ps(h);
  __m256i w = _mm256_cvtepu16_epi32(h);
  __m256i snan = _mm256_andnot_si256(
      _mm256_cmpeq_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x1ff)), _mm256_setzero_si256()),
      _mm256_cmpeq_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x7e00)), _mm256_set1_epi32(0x7c00)));
  __m256i bits = _mm256_andnot_si256(_mm256_and_si256(snan, _mm256_set1_epi32(0x400000)),
                                     _mm256_castps_si256(f));
  return _mm256_castsi256_ps(bits);
}

static inline __m128i f32x8_to_f16(__m256 f) { return _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT); }
#endif

void ddp_f32_to_f16_n(uint16_t *restrict dst, const float *restrict src, int64_t n) {
  int64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(dst + i), f32x8_to_f16(_mm256_loadu_ps(src + i)));
#endif
  for (; i < n; i++) dst[i] = ddp_f32_to_f16(src[i]);
}

void ddp_f16_to_f32_n(float *restrict dst, const uint16_t *restrict src, int64_t n) {
  int64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, f16x8_to_f32(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
  for (; i < n; i++) dst[i] = ddp_f16_to_f32(src[i]);
}

void ddp_f32_to_f16_div_n(uint16_t *restrict dst, const float *restrict src, float divisor,
                          int64_t n) {
  int64_t i = 0;
#ifdef __F16C__
  __m256 w = _mm256_set1_ps(divisor);
  for (; i + 8 <= n; i += 8) {
    __m256 once = f16x8_to_f32(f32x8_to_f16(_mm256_loadu_ps(src + i)));
    _mm_storeu_si128((__m128i *)(dst + i), f32x8_to_f16(_mm256_div_ps(once, w)));
  }
#endif
  for (; i < n; i++) dst[i] = ddp_f32_to_f16(ddp_f16_to_f32(ddp_f32_to_f16(src[i])) / divisor);
}

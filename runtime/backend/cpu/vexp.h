/* runtime/backend/cpu/vexp.h: an f32 exp the compiler can vectorise, shared by the CPU
 * kernels that exponentiate long runs (softmax in reduce.c, attention in attention.c).
 * Internal to the runtime. Callers that want the selects below turned into vector blends
 * compile with -fno-trapping-math (the #pragma at the top of reduce.c). */
#ifndef DDP_CPU_VEXP_H
#define DDP_CPU_VEXP_H

#include <stdint.h>
#include <string.h>

/* exp for f32 written so the compiler vectorises loops calling it (glibc's expf is a
 * scalar call): exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 (ln 2 split in two
 * parts for an exact product), exp(r) by the minimax polynomial of Cephes' expf (S. L.
 * Moshier, Cephes Math Library), about 1 ulp on [-87, 88]. Below -87 the result is 0 (true
 * values there are denormal), above 88 it saturates at exp(88); NaN stays NaN. The integer
 * n comes from the "magic number" rounding trick (adding 1.5 * 2^23) rather than a
 * float-to-int conversion, so NaN never reaches an undefined cast. */
static inline float exp_f32(float x) {
  const float magic = 12582912.0f; /* 1.5 * 2^23, bits 0x4B400000 */
  float xc = x > 88.0f ? 88.0f : x;
  xc = xc < -87.0f ? -87.0f : xc;
  float t = xc * 1.44269504088896341f + magic;
  float n = t - magic;
  uint32_t tb;
  memcpy(&tb, &t, sizeof tb);
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  uint32_t sb = (tb - 0x4B400000u + 127u) << 23;
  float scale;
  memcpy(&scale, &sb, sizeof scale);
  float y = p * scale;
  return x < -87.0f ? 0.0f : y;
}

#endif /* DDP_CPU_VEXP_H */

/* runtime/core/dtype.c: dtype names, sizes, promotion and the f16/bf16 conversions. */
#include <math.h>
#include <string.h>

#include "core/core.h"

static const char *const names[DDP_DTYPE_COUNT] = {"f32", "f64", "f16", "bf16",
                                                   "i64", "i32", "u8",  "bool"};
static const size_t sizes[DDP_DTYPE_COUNT] = {4, 8, 2, 2, 8, 4, 1, 1};

const char *ddp_dtype_name(int dtype) {
  return dtype >= 0 && dtype < DDP_DTYPE_COUNT ? names[dtype] : "?";
}

size_t ddp_dtype_size(int dtype) {
  return dtype >= 0 && dtype < DDP_DTYPE_COUNT ? sizes[dtype] : 0;
}

int ddp_dtype_is_floating(int dtype) { return dtype >= DDP_F32 && dtype <= DDP_BF16; }

int ddp_dtype_from_name(const char *name) {
  static const struct { const char *name; int dtype; } aliases[] = {
      {"float32", DDP_F32}, {"float", DDP_F32},    {"float64", DDP_F64}, {"double", DDP_F64},
      {"float16", DDP_F16}, {"half", DDP_F16},     {"bfloat16", DDP_BF16}, {"int64", DDP_I64},
      {"long", DDP_I64},    {"int32", DDP_I32},    {"int", DDP_I32},     {"uint8", DDP_U8},
      {"byte", DDP_U8},     {"bool", DDP_BOOL}};
  if (!name) return -1;
  for (int i = 0; i < DDP_DTYPE_COUNT; i++)
    if (!strcmp(name, names[i])) return i;
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (!strcmp(name, aliases[i].name)) return aliases[i].dtype;
  return -1;
}

/* Rank in the promotion lattice; f16 and bf16 share a rank and meet at f32. */
static int promotion_rank(int d) {
  switch (d) {
  case DDP_BOOL: return 0;
  case DDP_U8: return 1;
  case DDP_I32: return 2;
  case DDP_I64: return 3;
  case DDP_F16: case DDP_BF16: return 4;
  case DDP_F32: return 5;
  default: return 6; /* f64 */
  }
}

int ddp_promote_types(int a, int b) {
  if (a == b) return a;
  if ((a == DDP_F16 && b == DDP_BF16) || (a == DDP_BF16 && b == DDP_F16)) return DDP_F32;
  return promotion_rank(a) >= promotion_rank(b) ? a : b;
}

/* IEEE binary16 <-> binary32, bit-exact, round to nearest even. */
float ddp_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: normalise */
      int e = -1;
      do { e++; man <<= 1; } while (!(man & 0x400));
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t ddp_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) /* inf or nan */
    return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 | ((absx >> 13) & 0x3ff) : 0));
  if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65520: inf */
  if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
    if (absx < 0x33000000u) return (uint16_t)sign; /* < 2^-25 rounds to 0 */
    uint32_t e = absx >> 23, man = (absx & 0x7fffff) | 0x800000;
    int shift = 126 - (int)e; /* 14 + (113 - e) */
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = ((absx >> 13) - ((127 - 15) << 10)), rem = absx & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
  return (uint16_t)(sign | half);
}

float ddp_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t ddp_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

double ddp_load_f64(const void *p, int dtype) {
  switch (dtype) {
  case DDP_F32: return *(const float *)p;
  case DDP_F64: return *(const double *)p;
  case DDP_F16: return ddp_f16_to_f32(*(const uint16_t *)p);
  case DDP_BF16: return ddp_bf16_to_f32(*(const uint16_t *)p);
  case DDP_I64: return (double)*(const int64_t *)p;
  case DDP_I32: return *(const int32_t *)p;
  case DDP_U8: return *(const uint8_t *)p;
  case DDP_BOOL: return *(const uint8_t *)p != 0;
  }
  return 0;
}

/* Float to integer conversion truncates toward zero as C (and PyTorch) do; out-of-range
 * values are clamped rather than left undefined. */
static int64_t to_i64(double v) {
  if (isnan(v)) return 0;
  if (v >= 9.2233720368547758e18) return INT64_MAX;
  if (v <= -9.2233720368547758e18) return INT64_MIN;
  return (int64_t)v;
}

void ddp_store_f64(void *p, int dtype, double v) {
  switch (dtype) {
  case DDP_F32: *(float *)p = (float)v; break;
  case DDP_F64: *(double *)p = v; break;
  case DDP_F16: *(uint16_t *)p = ddp_f32_to_f16((float)v); break;
  case DDP_BF16: *(uint16_t *)p = ddp_f32_to_bf16((float)v); break;
  case DDP_I64: *(int64_t *)p = to_i64(v); break;
  case DDP_I32: {
    int64_t i = to_i64(v);
    *(int32_t *)p = (int32_t)(i > INT32_MAX ? INT32_MAX : i < INT32_MIN ? INT32_MIN : i);
    break;
  }
  case DDP_U8: *(uint8_t *)p = (uint8_t)to_i64(v); break; /* wraps modulo 256, as C */
  case DDP_BOOL: *(uint8_t *)p = v != 0; break;
  }
}

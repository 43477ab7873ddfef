// tilefuse: minimal stand-in for ROCm's <hip/hip_bf16.h> (see hip_runtime.h beside it): the bf16 storage
// type and its float conversions (round to nearest even, NaN kept quiet), as the portable rungs use them.
#pragma once
#include "hip_runtime.h"

struct __hip_bfloat16 {
  unsigned short data;
};

__host__ __device__ inline float __bfloat162float(__hip_bfloat16 h) {
  return __builtin_bit_cast(float, (unsigned int)h.data << 16);
}

__host__ __device__ inline __hip_bfloat16 __float2bfloat16(float f) {
  unsigned int u = __builtin_bit_cast(unsigned int, f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __hip_bfloat16{(unsigned short)((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return __hip_bfloat16{(unsigned short)(u >> 16)};
}

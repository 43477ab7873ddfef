// tilefuse: minimal stand-in for ROCm's <hip/hip_fp16.h> (see hip_runtime.h beside it): __half on the
// compiler's native _Float16, with the float conversions the portable rungs use.
#pragma once
#include "hip_runtime.h"

struct __half {
  _Float16 data;
};

__host__ __device__ inline float __half2float(__half h) { return static_cast<float>(h.data); }
__host__ __device__ inline __half __float2half(float f) { return __half{static_cast<_Float16>(f)}; }

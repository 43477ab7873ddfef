// tilefuse: header portable=yes
//
// Shared helpers of the CUDA C++ GEMM ladder (tilefuse/cuda/rung*.cu). Portable: it is translated to HIP
// with the portable rungs, so warp-level code here is written for any lane count (warpSize), never 32.
//
// ---------------------------------------------------------------------------------------------- the C ABI
// Every rung file tilefuse/cuda/rung<K>_<name>.cu is built by tilefuse/cuda/build.py into its own shared
// library and exports, with <K> its rung name ("1".."9", "5s"):
//
//   // Returns a cudaError_t as int (0 = success). Checks its launch with cudaGetLastError().
//   extern "C" int tilefuse_rung<K>(const void* A, const void* B, void* C, const void* bias,
//       int M, int N, int K, long long lda, long long ldb, long long ldc,
//       int dtype,      // 0 = bf16, 1 = fp16; C has the same dtype; fp32 accumulation
//       int epilogue,   // 0 none, 1 +bias[N], 2 gelu(x+bias[N]); a rung without it returns cudaErrorNotSupported
//       void* stream);  // cudaStream_t
//   extern "C" int tilefuse_rung<K>_b_layout(void);  // 0: B is [K,N] row-major (ldb >= N);
//                                                    // 1: B is given as [N,K] row-major (K-major B, ldb >= K)
//   extern "C" int tilefuse_rung<K>_requirements(int* m_multiple, int* n_multiple, int* k_multiple);
//
// A is [M,K] row-major (lda >= K), C is [M,N] row-major (ldc >= N); leading dimensions count elements.
// The Python side (tilefuse/cuda/launch.py) checks shapes, dtypes, the multiples, and makes operands
// contiguous and 16-byte aligned with leading dimensions that are multiples of 8 elements before calling,
// so a kernel may use 16-byte vector accesses whenever its n/k multiple is 8. The launchers check again
// (cheaply) and return cudaErrorInvalidValue rather than touch memory out of bounds.
//
// Metadata: the first lines of a rung file carry one line
//   // tilefuse: rung=7 arch=sm_90a portable=no reason="..." claims=HGMMA [emulate=yes] [dynamic_smem=BYTES]
// (see build.py for every key). The GELU of epilogue 2 is the exact (erf) form, as torch's default.
//
// Helpers below: dtype dispatch, bf16/fp16 <-> float, 16-byte vector unpacking, the epilogue, argument
// checks and portable warp reductions (lane-mask type and loop bounds from warpSize).
#pragma once

#if defined(TILEFUSE_CPU_EMULATION)
#include "emulator.h"
#else
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif
#include <stdint.h>

#if defined(TILEFUSE_CPU_EMULATION)
#define TF_LAUNCH(kernel, grid, block, smem, stream, ...) \
  tf_emu::launch((grid), (block), (smem), [&]() { kernel(__VA_ARGS__); })
#define TF_DYNAMIC_SMEM(name) unsigned char* name = tf_emu::dynamic_smem()
#else
#define TF_LAUNCH(kernel, grid, block, smem, stream, ...) \
  kernel<<<(grid), (block), (smem), static_cast<cudaStream_t>(stream)>>>(__VA_ARGS__)
#define TF_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#endif

namespace tf {

enum Dtype { kBF16 = 0, kFP16 = 1 };
enum Epilogue { kNoEpilogue = 0, kBias = 1, kBiasGelu = 2 };

template <typename T> struct Tag { using type = T; };

// Calls f(Tag<__nv_bfloat16>) or f(Tag<__half>) by the ABI's dtype code.
template <typename F>
inline int dispatch_dtype(int dtype, F&& f) {
  if (dtype == kBF16) return f(Tag<__nv_bfloat16>());
  if (dtype == kFP16) return f(Tag<__half>());
  return static_cast<int>(cudaErrorInvalidValue);
}

// ------------------------------------------------------------------------------------------- conversions
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }

// Eight 16-bit elements of one 16-byte load, as floats. (memcpy: no aliasing trouble; compiles to moves.)
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& v, float out[8]) {
  T vals[8];
  __builtin_memcpy(vals, &v, sizeof(vals));
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = to_float(vals[i]);
}

// 16-byte load of 8 elements, or zeros when the chunk is out of bounds (callers require n, k % 8 == 0, so a
// chunk is either wholly inside the matrix or wholly outside).
template <typename T>
__device__ __forceinline__ uint4 load8_or_zero(const T* p, bool inside) {
  uint4 z;
  z.x = z.y = z.z = z.w = 0u;
  return inside ? *reinterpret_cast<const uint4*>(p) : z;
}

// ---------------------------------------------------------------------------------------------- epilogue
__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

template <typename T>
__device__ __forceinline__ float epilogue_value(float acc, const T* bias, int col, int epilogue) {
  if (epilogue == kNoEpilogue) return acc;
  const float v = acc + to_float(bias[col]);
  return epilogue == kBiasGelu ? gelu_erf(v) : v;
}

// ------------------------------------------------------------------------------------- argument checks
// What every launcher checks before a launch: returns 0 or a cudaError_t code.
inline int check_args(const void* A, const void* B, const void* C, const void* bias, int M, int N, int K,
                      long long lda, long long ldb, long long ldc, int dtype, int epilogue, int b_layout,
                      int m_multiple, int n_multiple, int k_multiple) {
  if (dtype != kBF16 && dtype != kFP16) return static_cast<int>(cudaErrorInvalidValue);
  if (epilogue < kNoEpilogue || epilogue > kBiasGelu) return static_cast<int>(cudaErrorInvalidValue);
  if (M < 0 || N < 0 || K < 0) return static_cast<int>(cudaErrorInvalidValue);
  if (M % m_multiple || N % n_multiple || K % k_multiple) return static_cast<int>(cudaErrorInvalidValue);
  if (!A || !B || !C || (epilogue != kNoEpilogue && !bias)) return static_cast<int>(cudaErrorInvalidValue);
  if (lda < K || ldc < N || ldb < (b_layout == 0 ? N : K)) return static_cast<int>(cudaErrorInvalidValue);
  return 0;
}

// Blocks along one grid dimension (grid y and z are limited to 65535 blocks).
inline unsigned int ceil_div(long long a, long long b) { return static_cast<unsigned int>((a + b - 1) / b); }

// --------------------------------------------------------------------------------- portable warp code
// A lane mask has one bit per lane: 32 bits on NVIDIA, 64 on AMD CDNA. Writing ~lanemask_t(0) instead of
// 0xffffffff keeps "all lanes" right on both.
#if defined(__HIP__)
typedef unsigned long long lanemask_t;
#else
typedef unsigned int lanemask_t;
#endif

__device__ __forceinline__ float shfl_down(float v, int offset) {
#if defined(__HIP__)
  return __shfl_down(v, offset);
#else
  return __shfl_down_sync(~lanemask_t(0), v, offset);
#endif
}

__device__ __forceinline__ float shfl_xor(float v, int offset) {
#if defined(__HIP__)
  return __shfl_xor(v, offset);
#else
  return __shfl_xor_sync(~lanemask_t(0), v, offset);
#endif
}

// Sum over all lanes of the warp, result in every lane: log2(warpSize) butterfly steps starting at
// warpSize / 2 (5 steps on NVIDIA, 6 on AMD CDNA), never a hard-coded 16, 8, 4, 2, 1.
__device__ __forceinline__ float warp_allsum(float v) {
  for (int offset = warpSize / 2; offset > 0; offset /= 2) v += shfl_xor(v, offset);
  return v;
}

// Lanes per warp as a compile-time constant, for tile shapes laid out over one warp. Kernels that use it
// stay correct for any lane count (they use no warp-synchronous operation on it); it only decides which
// tile shape a warp owns. 64 on AMD CDNA (gfx9), 32 elsewhere.
#if defined(__HIP__)
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define TF_WARP_LANES __AMDGCN_WAVEFRONT_SIZE
#else
#define TF_WARP_LANES 64
#endif
#else
#define TF_WARP_LANES 32
#endif

}  // namespace tf

// The CUDA error string of a code the launchers returned (launch.py uses it for its messages).
extern "C" __attribute__((weak)) const char* tilefuse_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

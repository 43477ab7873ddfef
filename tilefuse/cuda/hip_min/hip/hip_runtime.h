// tilefuse: minimal stand-in for ROCm's <hip/hip_runtime.h>, for compile-only checks of the HIP translation
// with a bare clang (CI installs clang-19 and no ROCm). tilefuse/cuda/port.py puts this folder on the include
// path only when no ROCm install is found, together with -nogpuinc -include __clang_hip_runtime_wrapper.h:
// clang's own wrapper supplies __device__/__global__/__shared__ and the device math declarations (erff ->
// __ocml_erf_f32, left unresolved: -nogpulib links no device library, and -S stops before linking).
// This file declares just what the portable rungs use, on clang's AMDGPU builtins: thread/block coordinates,
// warpSize, __syncthreads, wave shuffles, vector types, the error type and the launch hooks that clang's
// <<<>>> lowering calls. Nothing here is linked or run.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif

#define __forceinline__ inline __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...) __attribute__((amdgpu_flat_work_group_size(1, __tf_first_arg(__VA_ARGS__, 0))))
#define __tf_first_arg(first, ...) first

// ---------------------------------------------------------------------------------- coordinates
#define TF_HIP_COORDINATE(TYPE, NAME, GX, GY, GZ)                                \
  struct TYPE {                                                                  \
    __device__ unsigned int get_x() const { return GX; }                         \
    __device__ unsigned int get_y() const { return GY; }                         \
    __device__ unsigned int get_z() const { return GZ; }                         \
    __declspec(property(get = get_x)) unsigned int x;                            \
    __declspec(property(get = get_y)) unsigned int y;                            \
    __declspec(property(get = get_z)) unsigned int z;                            \
  };                                                                             \
  extern const __device__ __attribute__((weak)) TYPE NAME;

TF_HIP_COORDINATE(__tf_thread_idx, threadIdx, __builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(),
                  __builtin_amdgcn_workitem_id_z())
TF_HIP_COORDINATE(__tf_block_idx, blockIdx, __builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(),
                  __builtin_amdgcn_workgroup_id_z())
TF_HIP_COORDINATE(__tf_block_dim, blockDim, __builtin_amdgcn_workgroup_size_x(),
                  __builtin_amdgcn_workgroup_size_y(), __builtin_amdgcn_workgroup_size_z())
TF_HIP_COORDINATE(__tf_grid_dim, gridDim, __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(),
                  __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y(),
                  __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z())
#undef TF_HIP_COORDINATE

#define warpSize __builtin_amdgcn_wavefrontsize()

__device__ inline void __syncthreads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// ------------------------------------------------------------------------------------ shuffles
__device__ inline int __lane_id() { return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)); }

__device__ inline int __tf_bpermute(int lane, int value) { return __builtin_amdgcn_ds_bpermute(lane * 4, value); }

__device__ inline float __shfl_down(float v, unsigned int delta, int width = warpSize) {
  const int self = __lane_id();
  const int src = ((self & (width - 1)) + (int)delta < width) ? self + (int)delta : self;
  return __builtin_bit_cast(float, __tf_bpermute(src, __builtin_bit_cast(int, v)));
}

__device__ inline float __shfl_xor(float v, int lane_mask, int width = warpSize) {
  const int self = __lane_id();
  int src = self ^ lane_mask;
  if (src >= ((self + width) & ~(width - 1))) src = self;
  return __builtin_bit_cast(float, __tf_bpermute(src, __builtin_bit_cast(int, v)));
}

// ---------------------------------------------------------------------------------- vector types
struct __attribute__((aligned(16))) uint4 { unsigned int x, y, z, w; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
__host__ __device__ inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

struct dim3 {
  unsigned int x, y, z;
  constexpr __host__ __device__ dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

// --------------------------------------------------------------------------------- runtime API
enum hipError_t { hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorNotSupported = 801 };
typedef struct ihipStream_t* hipStream_t;
enum hipFuncAttribute { hipFuncAttributeMaxDynamicSharedMemorySize = 8 };
extern "C" hipError_t hipGetLastError(void);
extern "C" const char* hipGetErrorString(hipError_t);
extern "C" hipError_t hipFuncSetAttribute(const void* func, hipFuncAttribute attr, int value);
extern "C" hipError_t __hipPushCallConfiguration(dim3 grid, dim3 block, size_t shared, hipStream_t stream);
extern "C" hipError_t __hipPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, hipStream_t* stream);
extern "C" hipError_t hipLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t shared,
                                      hipStream_t stream);

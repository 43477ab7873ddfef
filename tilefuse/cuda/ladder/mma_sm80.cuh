// tilefuse: header portable=no reason="inline PTX of sm_80 (cp.async, ldmatrix, mma.sync): NVIDIA instructions whose register fragments are spread over exactly 32 lanes; AMD's matrix cores (MFMA) have other shapes and layouts"
//
// Thin wrappers over the sm_80+ PTX that the tensor-core rung (rung 6) uses: asynchronous 16-byte copies
// global -> shared (cp.async, with zero-fill), 8x8 matrix loads from shared memory into the mma fragment
// layout (ldmatrix, plain and transposed), and the m16n8k16 bf16/fp16 mma with fp32 accumulation.
// Under TILEFUSE_CPU_EMULATION (tilefuse/cuda/emulator.h) the same names run on the CPU emulator, which
// implements each instruction's documented fragment layout, so rung 6 can be checked without a GPU.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), g = lane / 4, c = lane % 4:
//   A (16x16, row-major), 4 regs of 2 halves: a0 (g, 2c..2c+1) a1 (g+8, 2c..) a2 (g, 2c+8..) a3 (g+8, 2c+8..)
//   B (16x8, "col"), 2 regs:                  b0 (k = 2c..2c+1, n = g)  b1 (k = 2c+8.., n = g)
//   C/D (16x8 fp32), 4 floats:                d0,d1 (g, 2c..2c+1)   d2,d3 (g+8, 2c..2c+1)
// ldmatrix .x4: lane l gives the address of row l % 8 of matrix l / 8; each lane receives, for matrix i,
// the pair at (row g, columns 2c, 2c+1); with .trans the pair at (rows 2c, 2c+1, column g).
#pragma once

#include <stdint.h>

#if !defined(TILEFUSE_CPU_EMULATION)

namespace tf {
namespace sm80 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1 (.cg); src_bytes < 16 zero-fills the rest (0: all zeros, and
// nothing is read from src).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Wait until at most `kPending` committed groups of this thread are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}

// d += a * b for one 16x8x16 tile; T picks the input type (__nv_bfloat16 or __half).
template <typename T>
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace sm80
}  // namespace tf

#endif  // !TILEFUSE_CPU_EMULATION

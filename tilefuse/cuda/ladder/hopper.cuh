// tilefuse: header portable=no reason="TMA, mbarrier, wgmma and setmaxnreg are NVIDIA Hopper-only"
//
// The Hopper (sm_90a) building blocks of rungs 7-9, in one place: the wgmma shared-memory descriptor, the PTX
// wrappers (mbarrier, TMA, wgmma, setmaxnreg), the m64nNk16 wgmma instructions the rungs issue, the epilogue's
// fragment store, and the host's tensor-map encoding. Every function is __forceinline__ device code or a small
// host helper with internal linkage (the anonymous namespace): each rung's library is one translation unit, and
// a rung compiles to the same cubin, byte for byte, as when it carried its own copy of these lines
// (docs/decisions/029-layer-rule-and-shared-hopper-header.md).
// What stays in a rung is what only it uses (rung 9's cluster, multicast, L2-policy and bulk-store wrappers,
// its n240 instruction and tile walk).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "gelu_erfc.cuh"

namespace {

constexpr int WGMMA_K = 16;  // the k of one wgmma for 16-bit inputs (m64nNk16)

// A wait longer than this is a deadlock (an 8192^3 GEMM takes ~2 ms in all): trap, so a bug becomes a launch
// error instead of a hung device.
constexpr unsigned long long WAIT_TIMEOUT_NS = 5000000000ull;

// ---------------------------------------------------------------------------------------------------------
// wgmma shared-memory descriptor (PTX ISA, "Matrix Descriptor Format"): bits 0-13 start address >> 4,
// 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension byte offset >> 4, 49-51 base offset,
// 62-63 swizzle mode (1 = 128B). For a K-major operand in the 128B swizzle the leading offset is unused
// (the k16 slice lies inside one 128-byte row; encoded as 1) and the stride offset is the distance between
// consecutive 8-row core-matrix groups: 8 rows x 128 B = 1024 B. Tiles are 1 KB aligned, so base offset 0.
// Stepping k by 16 elements inside the 128-byte row adds 32 B to the start address: the hardware applies the
// XOR swizzle to the final address bits (bits 4-6 ^= bits 7-9), exactly as TMA did when it wrote the tile.
__host__ __device__ constexpr uint64_t desc_field(uint32_t bytes) { return (uint64_t)((bytes & 0x3FFFF) >> 4); }
__host__ __device__ constexpr uint64_t make_desc_sw128(uint32_t smem_addr) {
    return desc_field(smem_addr) | (desc_field(16) << 16) | (desc_field(1024) << 32) | (1ull << 62);
}
constexpr uint64_t DESC_K_STEP = desc_field(WGMMA_K * 2);  // +32 bytes a k16 step, in descriptor units
static_assert(make_desc_sw128(0x0400) == (0x40ull | (1ull << 16) | (64ull << 32) | (1ull << 62)), "descriptor");
static_assert(DESC_K_STEP == 2, "a k16 step of 16-bit elements is 32 bytes");

// ---------------------------------------------------------------------------------------------------------
// PTX wrappers.
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done != 0;
}
__device__ __forceinline__ unsigned long long global_timer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// Wait until the phase of parity `parity` has completed. A fresh barrier is in phase 0, so waiting for
// parity 1 returns at once (the "previous" phase counts as complete): producers use that for the first lap.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    if (mbar_try_wait(bar, parity)) return;
    const unsigned long long start = global_timer_ns();
    while (!mbar_try_wait(bar, parity)) {
        if (global_timer_ns() - start > WAIT_TIMEOUT_NS) __trap();
    }
}

__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// TMA: load the box at (c0 = element along the contiguous dim, c1 = row) into shared memory at dst, and
// count its bytes against the mbarrier's transaction count.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
        ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
        : "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Tie the accumulators to this point of the program: the compiler must not move reads or writes of them
// across a wgmma wait (it does not know wgmma writes them asynchronously).
template <int NREG>
__device__ __forceinline__ void fence_accumulators(float (&d)[NREG]) {
#pragma unroll
    for (int i = 0; i < NREG; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// setmaxnreg: executed by all threads of a warpgroup; takes effect only because the kernel has a register
// cap at entry (__launch_bounds__(THREADS, 1) in rungs 8 and 9).
template <int REGS>
__device__ __forceinline__ void regs_release() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS)); }
template <int REGS>
__device__ __forceinline__ void regs_claim() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS)); }

#define TF_ACC_8(d, i) "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                       "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define TF_ACC_64(d, i) TF_ACC_8(d, i + 0), TF_ACC_8(d, i + 8), TF_ACC_8(d, i + 16), TF_ACC_8(d, i + 24), \
                        TF_ACC_8(d, i + 32), TF_ACC_8(d, i + 40), TF_ACC_8(d, i + 48), TF_ACC_8(d, i + 56)
#define TF_ACC_128(d) TF_ACC_64(d, 0), TF_ACC_64(d, 64)

// D(64x128, fp32) (+)= A(64x16, smem, K-major) * B(16x128 given as 128x16, smem, K-major).
// scale_d = 0 ignores D's old value (the first k16 step of a tile). imm-scale-a/b = 1, imm-trans-a/b = 0
// (both operands K-major).
#define TF_WGMMA_M64N128K16(DTS, d, desc_a, desc_b, scale_d) \
    asm volatile( \
        "{\n.reg .pred p;\n" \
        "setp.ne.b32 p, %66, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." DTS "." DTS " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
        : TF_ACC_64(d, 0) \
        : "l"(desc_a), "l"(desc_b), "r"(scale_d) \
        : "memory")

template <int DT>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
    if constexpr (DT == 0) {
        TF_WGMMA_M64N128K16("bf16", d, desc_a, desc_b, scale_d);
    } else {
        TF_WGMMA_M64N128K16("f16", d, desc_a, desc_b, scale_d);
    }
}

// D(64x256, fp32) (+)= A(64x16, smem, K-major) * B(16x256 given as 256x16, smem, K-major).
// scale_d = 0 ignores D's old value (the first k16 step of a tile). imm-scale-a/b = 1, imm-trans-a/b = 0
// (both operands K-major).
#define TF_WGMMA_M64N256K16(DTS, d, desc_a, desc_b, scale_d) \
    asm volatile( \
        "{\n.reg .pred p;\n" \
        "setp.ne.b32 p, %130, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." DTS "." DTS " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
        "}, %128, %129, p, 1, 1, 0, 0;\n}\n" \
        : TF_ACC_128(d) \
        : "l"(desc_a), "l"(desc_b), "r"(scale_d) \
        : "memory")


template <int DT>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
    if constexpr (DT == 0) {
        TF_WGMMA_M64N256K16("bf16", d, desc_a, desc_b, scale_d);
    } else {
        TF_WGMMA_M64N256K16("f16", d, desc_a, desc_b, scale_d);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Epilogue: the m64nNk16 fp32 accumulator fragment. Warp w of the warpgroup holds rows 16w..16w+15; lane
// = 4*g + t holds, for every n8 block j, d[4j+0..1] at (row 16w+g, cols 8j+2t, 8j+2t+1) and d[4j+2..3] at
// (row 16w+g+8, the same cols). Two neighbouring columns go out as one 32-bit store.
// The GeLU of epilogue 2: gelu_erfc (gelu_erfc.cuh), branch-free from one reciprocal and one exp2.

template <int DT>
__device__ __forceinline__ float load_scalar(const void* p, long long i) {
    if constexpr (DT == 0) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
    else return __half2float(reinterpret_cast<const __half*>(p)[i]);
}
template <int DT>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    if constexpr (DT == 0) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t*>(&v);
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t*>(&v);
    }
}
template <int DT>
__device__ __forceinline__ void store_scalar(void* p, long long i, float v) {
    if constexpr (DT == 0) reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
    else reinterpret_cast<__half*>(p)[i] = __float2half_rn(v);
}

// EPI (0 none, 1 + bias, 2 GeLU(+ bias)) is a template argument, a kernel each: chosen at run time it put a bias
// branch and an erff GeLU around every accumulator pair, code a plain tile had to fetch its way through (rung 9's
// ncu profile: tensor pipe active 76 % of the time against cuBLAS's 95 %;
// docs/decisions/003-epilogue-as-template-argument.md).
template <int DT, int EPI, int NREG>
__device__ __forceinline__ void store_fragment(const float (&d)[NREG], void* C, const void* bias, int M, int N,
                                               long long ldc, int row0, int col0, bool pair_ok) {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < NREG / 4; ++j) {
        const int col = col0 + 8 * j + 2 * t;
        float b0 = 0.f, b1 = 0.f;
        if constexpr (EPI != 0) {
            // (the empty asm keeps ptxas from hoisting every pair's bias loads to the top: with 128 accumulators
            // live that spilled 4-44 bytes; one pair's loads at a time do not)
            asm volatile("" ::: "memory");
            if (col < N) b0 = load_scalar<DT>(bias, col);
            if (col + 1 < N) b1 = load_scalar<DT>(bias, col + 1);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + 16 * warp + g + 8 * h;
            float v0 = d[4 * j + 2 * h], v1 = d[4 * j + 2 * h + 1];
            if constexpr (EPI != 0) { v0 += b0; v1 += b1; }
            if constexpr (EPI == 2) { v0 = gelu_erfc(v0); v1 = gelu_erfc(v1); }
            if (row < M) {
                const long long at = (long long)row * ldc + col;
                if (pair_ok && col + 1 < N) {
                    *reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(C) + 2 * at) = pack2<DT>(v0, v1);
                } else {
                    if (col < N) store_scalar<DT>(C, at, v0);
                    if (col + 1 < N) store_scalar<DT>(C, at + 1, v1);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Host side: the tensor maps, through the driver entry point (no -lcuda at link time).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    if (fn == nullptr) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult status;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &status) !=
                cudaSuccess ||
            status != cudaDriverEntryPointSuccess)
            return nullptr;
        fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }
    return fn;
}

// A row-major [rows, cols] matrix with a row stride of `ld` elements, read in boxes of box_rows x box_cols
// (box_cols * 2 bytes <= 128: one 128B-swizzle row).
cudaError_t encode_2d(CUtensorMap* map, int dtype, const void* ptr, long long rows, long long cols, long long ld,
                      int box_rows, int box_cols) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (encode == nullptr) return cudaErrorNotSupported;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)(ld * 2)};
    const cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows};
    const cuuint32_t elem_strides[2] = {1, 1};
    CUresult r = encode(map, dtype == 0 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                        const_cast<void*>(ptr), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

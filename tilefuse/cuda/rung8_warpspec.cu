// tilefuse: rung=8 arch=sm_90a portable=no reason="TMA, mbarrier, wgmma and setmaxnreg are NVIDIA Hopper-only" claims=HGMMA
//
// Rung 8: warp specialisation. A producer warpgroup that only issues TMA copies, two consumer warpgroups that
// only issue wgmma, registers moved from the first to the others with setmaxnreg, 128x256 tiles, 4 stages.
//
// What it adds over rung 7 (one warpgroup that both loads and computes, 128x128 tiles):
//   * Roles. Warpgroup 0 is the producer: one thread waits for a free stage ("empty" mbarrier) and issues the
//     TMA copies of the next k-tile. Warpgroups 1 and 2 are consumers: they wait for a full stage, issue
//     wgmma, and release the stage. Neither role ever waits on the other's instruction stream, so the copy
//     engine runs up to 4 stages ahead of the tensor cores all the time (rung 7's loads were issued from the
//     same thread that waited for its own wgmma to drain).
//   * setmaxnreg: the producer needs ~30 registers, a consumer 128 accumulators plus addressing. With
//     __launch_bounds__(384, 1) every thread starts at 168; the producer gives back down to 40 and the
//     consumers grow to 232 (128*40 + 256*232 = 64512 <= 65536 registers an SM).
//   * A 128x256 CTA tile (each consumer 64x256 with m64n256k16, the largest wgmma): per k-tile a CTA moves
//     48 KB for 4.2 MFLOP, 85 FLOP/byte against rung 7's 64, cutting the L2->SM traffic that limits Hopper.
//   * The consumer keeps one k-tile of wgmma in flight (wait_group 1) and releases the previous stage, so the
//     tensor cores never drain between k-tiles.
//
// Measured (H200, bf16, the ladder suite, interleaved with cuBLAS, the epilogue a template argument;
//   docs/decisions/001-ladder-rung-by-rung.md): 4096x4096x4096 609.9 TFLOP/s (0.90x cublas_nt, the
//   K-major-B cuBLAS call); 8192x8192x8192 625.9 TFLOP/s (0.91x); 16384x4096x4096 607.5 TFLOP/s (0.91x).
//
// Layouts: A is [M,K] row-major (lda >= K), B is given as [N,K] row-major (K-major B: tilefuse_rung8_b_layout()
// returns 1; ldb >= K), C is [M,N] row-major (ldc >= N). bf16 (dtype 0) or fp16 (dtype 1) in and out, fp32
// accumulation. epilogue 0: C = A*B^T; 1: + bias[N]; 2: gelu(erf form)(x + bias[N]); bias has C's dtype.
// Requirements (TMA): A and B 16-byte aligned, lda and ldb multiples of 8 elements (16-byte row strides),
// K a multiple of 8 and >= 8; M and N any size. Anything else returns cudaErrorInvalidValue before a launch.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "gelu_erfc.cuh"

namespace {

// ---------------------------------------------------------------------------------------------------------
// Tile shape and shared-memory plan.
constexpr int BM = 128;            // two consumer warpgroups x 64 rows
constexpr int BN = 256;            // m64n256k16: 128 fp32 accumulators a consumer thread
constexpr int BK = 64;             // 64 bf16 = 128 bytes = exactly one 128B swizzle row
constexpr int WGMMA_K = 16;
constexpr int STAGES = 4;          // 4 x 48 KB = 192 KB; a 5th stage would not fit in 227 KB
constexpr int CONSUMERS = 2;
constexpr int THREADS = 128 * (1 + CONSUMERS);
constexpr int CONSUMER_WARPS = CONSUMERS * 4;
constexpr int PRODUCER_REGS = 40;  // the producer loop needs ~30; 40 leaves room and 232 for the consumers
constexpr int CONSUMER_REGS = 232;
static_assert(128 * PRODUCER_REGS + 128 * CONSUMERS * CONSUMER_REGS <= 65536, "register file of an SM");
constexpr int A_TILE_BYTES = BM * BK * 2;                 // 16 KB
constexpr int B_TILE_BYTES = BN * BK * 2;                 // 32 KB
constexpr int STAGE_BYTES = A_TILE_BYTES + B_TILE_BYTES;  // the expect_tx count of one stage
constexpr int CONSUMER_A_BYTES = 64 * BK * 2;             // consumer c reads rows 64c..64c+63 of the A tile
constexpr int SWIZZLE_ATOM_BYTES = 1024;                  // 8 rows x 128 B: the 128B swizzle repeats every 1 KB
constexpr int SMEM_BYTES = SWIZZLE_ATOM_BYTES /* alignment slack */ + STAGES * STAGE_BYTES + 2 * STAGES * 8;
static_assert(A_TILE_BYTES % SWIZZLE_ATOM_BYTES == 0 && B_TILE_BYTES % SWIZZLE_ATOM_BYTES == 0,
              "every tile must start on a 1 KB swizzle atom so TMA's and wgmma's swizzle phases agree");
static_assert(SMEM_BYTES <= 227 * 1024, "the per-block shared-memory limit of sm_90");

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
// cap at entry (__launch_bounds__(THREADS, 1)).
template <int REGS>
__device__ __forceinline__ void regs_release() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS)); }
template <int REGS>
__device__ __forceinline__ void regs_claim() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS)); }

#define TF_ACC_8(d, i) "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                       "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define TF_ACC_64(d, i) TF_ACC_8(d, i + 0), TF_ACC_8(d, i + 8), TF_ACC_8(d, i + 16), TF_ACC_8(d, i + 24), \
                        TF_ACC_8(d, i + 32), TF_ACC_8(d, i + 40), TF_ACC_8(d, i + 48), TF_ACC_8(d, i + 56)
#define TF_ACC_128(d) TF_ACC_64(d, 0), TF_ACC_64(d, 64)

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
// The GeLU of epilogue 2: gelu_erfc (gelu_erfc.cuh).

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
            asm volatile("" ::: "memory");  // one pair's bias loads at a time: hoisted, they cost registers
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
template <int DT, int EPI>
__global__ void __launch_bounds__(THREADS, 1)
rung8_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b, void* C,
             const void* bias, int M, int N, int K, long long ldc, int pair_ok) {
    extern __shared__ __align__(16) uint8_t smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + SWIZZLE_ATOM_BYTES - 1) & ~uint32_t(SWIZZLE_ATOM_BYTES - 1);
    const uint32_t s_a = base;                                // STAGES x [128 rows][128 B], swizzled
    const uint32_t s_b = base + STAGES * A_TILE_BYTES;        // STAGES x [256 rows][128 B], swizzled
    const uint32_t full = s_b + STAGES * B_TILE_BYTES;        // STAGES mbarriers: the stage's bytes landed
    const uint32_t empty = full + STAGES * 8;                 // STAGES mbarriers: all 8 consumer warps are done

    const int warpgroup = threadIdx.x / 128;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int k_tiles = (K + BK - 1) / BK;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + 8 * s, 1);                 // one arrive.expect_tx by the producer
            mbar_init(empty + 8 * s, CONSUMER_WARPS);   // one arrive a consumer warp
        }
        fence_mbarrier_init();  // make the initialised barriers visible to the copy engine
        prefetch_tensormap(&tm_a);
        prefetch_tensormap(&tm_b);
    }
    __syncthreads();

    if (warpgroup == 0) {
        // Producer: one thread walks the k-tiles, STAGES ahead of the consumers at most.
        regs_release<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            int s = 0;
            uint32_t phase = 0;
            for (int kt = 0; kt < k_tiles; ++kt) {
                mbar_wait(empty + 8 * s, phase ^ 1u);  // first lap: parity 1 of a fresh barrier passes at once
                mbar_arrive_expect_tx(full + 8 * s, STAGE_BYTES);
                tma_load_2d(s_a + s * A_TILE_BYTES, &tm_a, kt * BK, m0, full + 8 * s);
                tma_load_2d(s_b + s * B_TILE_BYTES, &tm_b, kt * BK, n0, full + 8 * s);
                if (++s == STAGES) { s = 0; phase ^= 1u; }
            }
        }
    } else {
        // Consumers: warpgroup 1 computes rows 0..63 of the tile, warpgroup 2 rows 64..127, all 256 columns.
        regs_claim<CONSUMER_REGS>();
        const int consumer = warpgroup - 1;
        const int lane = threadIdx.x % 32;
        float acc[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) acc[i] = 0.f;

        int s = 0, prev = 0;
        uint32_t phase = 0;
        for (int kt = 0; kt < k_tiles; ++kt) {
            mbar_wait(full + 8 * s, phase);
            const uint64_t da = make_desc_sw128(s_a + s * A_TILE_BYTES + consumer * CONSUMER_A_BYTES);
            const uint64_t db = make_desc_sw128(s_b + s * B_TILE_BYTES);
            fence_accumulators(acc);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / WGMMA_K; ++kk) {
                wgmma_m64n256k16<DT>(acc, da + kk * DESC_K_STEP, db + kk * DESC_K_STEP,
                                     (kt > 0 || kk > 0) ? 1u : 0u);
            }
            wgmma_commit();
            // Keep this k-tile's wgmma in flight; the previous one has finished, so its stage is free.
            wgmma_wait<1>();
            fence_accumulators(acc);
            if (kt > 0 && lane == 0) mbar_arrive(empty + 8 * prev);
            __syncwarp();  // the warp whole again before the next .sync.aligned wgmma instructions
            prev = s;
            if (++s == STAGES) { s = 0; phase ^= 1u; }
        }
        wgmma_wait<0>();
        fence_accumulators(acc);
        // The last stage needs no release: nothing is loaded after it.
        store_fragment<DT, EPI>(acc, C, bias, M, N, ldc, m0 + 64 * consumer, n0, pair_ok != 0);
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

extern "C" int tilefuse_rung8_b_layout(void) { return 1; }

extern "C" int tilefuse_rung8_requirements(int* m_multiple, int* n_multiple, int* k_multiple) {
    if (m_multiple) *m_multiple = 1;
    if (n_multiple) *n_multiple = 1;
    if (k_multiple) *k_multiple = 8;  // TMA row strides must be multiples of 16 bytes
    return 0;
}

extern "C" int tilefuse_rung8(const void* A, const void* B, void* C, const void* bias, int M, int N, int K,
                              long long lda, long long ldb, long long ldc, int dtype, int epilogue, void* stream) {
    if (dtype != 0 && dtype != 1) return cudaErrorInvalidValue;
    if (epilogue < 0 || epilogue > 2 || (epilogue != 0 && bias == nullptr)) return cudaErrorInvalidValue;
    if (M < 0 || N < 0 || K < 0) return cudaErrorInvalidValue;
    if (M == 0 || N == 0) return cudaSuccess;
    if (K < 8 || K % 8 != 0 || lda < K || ldb < K || ldc < N || lda % 8 != 0 || ldb % 8 != 0) return cudaErrorInvalidValue;
    if (!aligned16(A) || !aligned16(B) || (reinterpret_cast<uintptr_t>(C) & 1) != 0) return cudaErrorInvalidValue;

    CUtensorMap tm_a, tm_b;
    cudaError_t e = encode_2d(&tm_a, dtype, A, M, K, lda, BM, BK);
    if (e != cudaSuccess) return e;
    e = encode_2d(&tm_b, dtype, B, N, K, ldb, BN, BK);
    if (e != cudaSuccess) return e;

    const int pair_ok = ((reinterpret_cast<uintptr_t>(C) & 3) == 0 && ldc % 2 == 0) ? 1 : 0;
    const dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
    if (grid.y > 65535) return cudaErrorInvalidValue;
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    using Kernel = void (*)(const CUtensorMap, const CUtensorMap, void*, const void*, int, int, int, long long, int);
    static const Kernel kernels[2][3] = {{rung8_kernel<0, 0>, rung8_kernel<0, 1>, rung8_kernel<0, 2>},
                                         {rung8_kernel<1, 0>, rung8_kernel<1, 1>, rung8_kernel<1, 2>}};
    const Kernel kernel = kernels[dtype][epilogue];
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
    if (e != cudaSuccess) return e;
    kernel<<<grid, THREADS, SMEM_BYTES, s>>>(tm_a, tm_b, C, bias, M, N, K, ldc, pair_ok);
    return (int)cudaGetLastError();
}

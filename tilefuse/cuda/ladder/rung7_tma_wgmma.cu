// tilefuse: rung=7 arch=sm_90a portable=no reason="TMA, mbarrier and wgmma are NVIDIA Hopper-only" claims=HGMMA
//
// Rung 7: Hopper's own data path. TMA loads into 128B-swizzled shared memory, an mbarrier pipeline, wgmma
// issued by a warpgroup.
//
// What it adds over rung 6 (mma.sync + ldmatrix + cp.async):
//   * The copy engine (TMA, cp.async.bulk.tensor) moves each 128x64 operand tile with ONE instruction from one
//     thread, writing it already XOR-swizzled (128B pattern), where rung 6 needed every thread to issue
//     16-byte cp.async copies and compute swizzled addresses. Out-of-range rows/columns are zero-filled by the
//     hardware, so M, N and K tails need no predication in the main loop.
//   * Completion is tracked by mbarriers with a transaction byte count (expect_tx / complete_tx) instead of
//     cp.async.wait_group + __syncthreads: a stage is ready when its bytes have landed, nothing else.
//   * The tensor cores are driven by wgmma.mma_async: one warpgroup (4 warps) issues m64n128k16 reading both
//     operands straight from shared memory through 64-bit descriptors; no ldmatrix, no register copies of A/B,
//     and the instruction is asynchronous, so issue and tensor-core work overlap.
// Tile: 128x128x64 per CTA (one warpgroup, two m64n128 accumulators = 128 fp32 registers a thread),
// 3 stages (96 KB), so two CTAs fit on an SM and one's epilogue hides behind the other's main loop.
// The single thread 0 is both the TMA producer and a consumer: it refills a stage after all four warps
// released it (empty mbarrier). Rung 8 separates those roles.
//
// Measured (H200, bf16, the ladder suite, interleaved with cuBLAS, the epilogue a template argument;
//   docs/decisions/001-ladder-rung-by-rung.md): 4096x4096x4096 570.3 TFLOP/s (0.84x cublas_nt, the
//   K-major-B cuBLAS call); 8192x8192x8192 567.2 TFLOP/s (0.83x); 16384x4096x4096 565.1 TFLOP/s (0.85x).
//
// Layouts: A is [M,K] row-major (lda >= K), B is given as [N,K] row-major (K-major B: tilefuse_rung7_b_layout()
// returns 1; ldb >= K), C is [M,N] row-major (ldc >= N). bf16 (dtype 0) or fp16 (dtype 1) in and out, fp32
// accumulation. epilogue 0: C = A*B^T; 1: + bias[N]; 2: gelu(erf form)(x + bias[N]); bias has C's dtype.
// Requirements (TMA): A and B 16-byte aligned, lda and ldb multiples of 8 elements (16-byte row strides),
// K a multiple of 8 and >= 8; M and N any size. Anything else returns cudaErrorInvalidValue before a launch.
#include "hopper.cuh"  // the TMA / mbarrier / wgmma helpers rungs 7-9 share

namespace {

// ---------------------------------------------------------------------------------------------------------
// Tile shape and shared-memory plan.
constexpr int BM = 128;          // rows of C a CTA computes (two m64 wgmma halves)
constexpr int BN = 128;          // columns: m64n128k16 keeps 128 accumulators a thread (64 a half)
constexpr int BK = 64;           // 64 bf16 = 128 bytes = exactly one 128B swizzle row
constexpr int STAGES = 3;        // 3 x 32 KB: two CTAs an SM (2 x 97 KB of 228 KB); 4 stages would allow one
constexpr int THREADS = 128;     // one warpgroup
constexpr int CONSUMER_WARPS = THREADS / 32;
constexpr int A_TILE_BYTES = BM * BK * 2;
constexpr int B_TILE_BYTES = BN * BK * 2;
constexpr int STAGE_BYTES = A_TILE_BYTES + B_TILE_BYTES;  // the expect_tx count of one stage
constexpr int SWIZZLE_ATOM_BYTES = 1024;                  // 8 rows x 128 B: the 128B swizzle repeats every 1 KB
constexpr int SMEM_BYTES = SWIZZLE_ATOM_BYTES /* alignment slack */ + STAGES * STAGE_BYTES + 2 * STAGES * 8;
constexpr int HALF_A_BYTES = 64 * BK * 2;                 // offset of rows 64..127 of the A tile
static_assert(A_TILE_BYTES % SWIZZLE_ATOM_BYTES == 0 && B_TILE_BYTES % SWIZZLE_ATOM_BYTES == 0,
              "every tile must start on a 1 KB swizzle atom so TMA's and wgmma's swizzle phases agree");
static_assert(SMEM_BYTES <= 113 * 1024, "two CTAs an SM need <= 113 KB each");

// ---------------------------------------------------------------------------------------------------------
template <int DT, int EPI>
__global__ void __launch_bounds__(THREADS, 2)
rung7_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b, void* C,
             const void* bias, int M, int N, int K, long long ldc, int pair_ok) {
    extern __shared__ __align__(16) uint8_t smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + SWIZZLE_ATOM_BYTES - 1) & ~uint32_t(SWIZZLE_ATOM_BYTES - 1);
    const uint32_t s_a = base;                                // STAGES x [128 rows][128 B], swizzled
    const uint32_t s_b = base + STAGES * A_TILE_BYTES;        // STAGES x [128 rows][128 B], swizzled
    const uint32_t full = s_b + STAGES * B_TILE_BYTES;        // STAGES mbarriers: the stage's bytes landed
    const uint32_t empty = full + STAGES * 8;                 // STAGES mbarriers: all 4 warps finished reading it

    const int tid = threadIdx.x, lane = tid % 32;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int k_tiles = (K + BK - 1) / BK;

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + 8 * s, 1);                  // one arrive.expect_tx by the producer
            mbar_init(empty + 8 * s, CONSUMER_WARPS);    // one arrive a warp
        }
        fence_mbarrier_init();  // make the initialised barriers visible to the copy engine
        prefetch_tensormap(&tm_a);
        prefetch_tensormap(&tm_b);
    }
    __syncthreads();

    auto issue = [&](int kt, int s) {
        mbar_arrive_expect_tx(full + 8 * s, STAGE_BYTES);
        tma_load_2d(s_a + s * A_TILE_BYTES, &tm_a, kt * BK, m0, full + 8 * s);
        tma_load_2d(s_b + s * B_TILE_BYTES, &tm_b, kt * BK, n0, full + 8 * s);
    };
    if (tid == 0) {
        for (int kt = 0; kt < STAGES && kt < k_tiles; ++kt) issue(kt, kt);
    }

    float acc0[64], acc1[64];  // rows 0..63 and 64..127 of the tile
#pragma unroll
    for (int i = 0; i < 64; ++i) { acc0[i] = 0.f; acc1[i] = 0.f; }

    int s = 0;
    uint32_t phase = 0;
    for (int kt = 0; kt < k_tiles; ++kt) {
        mbar_wait(full + 8 * s, phase);
        const uint64_t da0 = make_desc_sw128(s_a + s * A_TILE_BYTES);
        const uint64_t da1 = make_desc_sw128(s_a + s * A_TILE_BYTES + HALF_A_BYTES);
        const uint64_t db = make_desc_sw128(s_b + s * B_TILE_BYTES);
        fence_accumulators(acc0);
        fence_accumulators(acc1);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / WGMMA_K; ++kk) {
            const uint32_t scale_d = (kt > 0 || kk > 0) ? 1u : 0u;
            wgmma_m64n128k16<DT>(acc0, da0 + kk * DESC_K_STEP, db + kk * DESC_K_STEP, scale_d);
            wgmma_m64n128k16<DT>(acc1, da1 + kk * DESC_K_STEP, db + kk * DESC_K_STEP, scale_d);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_accumulators(acc0);
        fence_accumulators(acc1);
        // This warp is done reading stage s; thread 0 refills it once all four warps are.
        if (lane == 0) mbar_arrive(empty + 8 * s);
        if (tid == 0 && kt + STAGES < k_tiles) {
            mbar_wait(empty + 8 * s, phase);
            issue(kt + STAGES, s);
        }
        __syncwarp();  // warp 0 whole again before the next .sync.aligned wgmma instructions
        if (++s == STAGES) { s = 0; phase ^= 1u; }
    }

    store_fragment<DT, EPI>(acc0, C, bias, M, N, ldc, m0, n0, pair_ok != 0);
    store_fragment<DT, EPI>(acc1, C, bias, M, N, ldc, m0 + 64, n0, pair_ok != 0);
}

}  // namespace

extern "C" int tilefuse_rung7_b_layout(void) { return 1; }

extern "C" int tilefuse_rung7_requirements(int* m_multiple, int* n_multiple, int* k_multiple) {
    if (m_multiple) *m_multiple = 1;
    if (n_multiple) *n_multiple = 1;
    if (k_multiple) *k_multiple = 8;  // TMA row strides must be multiples of 16 bytes
    return 0;
}

extern "C" int tilefuse_rung7(const void* A, const void* B, void* C, const void* bias, int M, int N, int K,
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
    static const Kernel kernels[2][3] = {{rung7_kernel<0, 0>, rung7_kernel<0, 1>, rung7_kernel<0, 2>},
                                         {rung7_kernel<1, 0>, rung7_kernel<1, 1>, rung7_kernel<1, 2>}};
    const Kernel kernel = kernels[dtype][epilogue];
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
    if (e != cudaSuccess) return e;
    kernel<<<grid, THREADS, SMEM_BYTES, s>>>(tm_a, tm_b, C, bias, M, N, K, ldc, pair_ok);
    return (int)cudaGetLastError();
}

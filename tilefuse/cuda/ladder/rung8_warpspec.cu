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
#include "hopper.cuh"  // the TMA / mbarrier / wgmma helpers rungs 7-9 share

namespace {

// ---------------------------------------------------------------------------------------------------------
// Tile shape and shared-memory plan.
constexpr int BM = 128;            // two consumer warpgroups x 64 rows
constexpr int BN = 256;            // m64n256k16: 128 fp32 accumulators a consumer thread
constexpr int BK = 64;             // 64 bf16 = 128 bytes = exactly one 128B swizzle row
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

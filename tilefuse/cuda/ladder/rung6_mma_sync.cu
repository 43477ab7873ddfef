// tilefuse: rung=6 arch=sm_80 portable=no reason="mma.sync, ldmatrix and cp.async are NVIDIA PTX (sm_80+), and the mma register fragments are laid out over exactly 32 lanes (lane / 4, lane % 4); AMD's MFMA needs a different kernel" claims=HMMA emulate=yes dynamic_smem=147456
//
// Rung 6, tensor cores: mma.sync.m16n8k16 (bf16/fp16 in, fp32 accumulate) fed by ldmatrix from XOR-
// swizzled shared memory, which cp.async fills through a 3-stage pipeline. Adds over rung 5:
//   * tensor cores: one mma.sync does 4096 multiply-adds where rung 5 did one FFMA (HMMA in the SASS);
//   * a 128x256x64 block tile for 8 warps, each warp 64x64 (4 x 8 mma tiles, 128 fp32 accumulators a
//     thread), so each k16 step loads 4 A and 4 B ldmatrix.x4 fragments for 32 mma: 4 mma per fragment;
//   * cp.async (global -> shared without registers) with 3 stages in flight: the loads of tile k+2 are
//     issued while the tensor cores work on tile k; one barrier per 64-deep tile;
//   * an XOR swizzle of the 16-byte chunks of each shared row (chunk ^ (row % 8)): the 8 row addresses
//     of an ldmatrix land in 8 different bank groups, where a plain layout puts all 8 in one (A rows are
//     128 bytes, B rows 512 bytes), so ldmatrix runs conflict-free;
//   * grouped rasterisation (8 block rows per group) so that blocks in flight share A and B in L2.
// Shared memory: 3 x (128x64 + 64x256) x 2 bytes = 144 KiB, under the 163 KiB a block may use on an
// A100 (sm_80), so the same binary runs on sm_80 and newer; 4 stages (192 KiB) would fit only sm_90.
// Registers: ~200 a thread, so one 256-thread block per SM (__launch_bounds__(256, 1)).
// Layouts: A [M,K], B [K,N] (read with ldmatrix.trans), C [M,N], all row-major; any M, N % 8 == 0,
// K % 8 == 0 (edges zero-filled by cp.async's src-size operand); bf16/fp16; every epilogue.
// Measured (H200, bf16, docs/decisions/001-ladder-rung-by-rung.md): 4096x4096x4096 232.7 TFLOP/s (0.30x
//   cuBLAS); 8192x8192x8192 364.5 TFLOP/s (0.53x cuBLAS); 16384x4096x4096 360.0 TFLOP/s (0.53x cuBLAS);
//   16x8192x8192 3.8 TFLOP/s (0.08x cuBLAS).
#include "common.cuh"
#include "mma_sm80.cuh"

namespace {

using namespace tf::sm80;

constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 3;
constexpr int kThreads = 256;
constexpr int kWarpsM = 2, kWarpsN = 4;
constexpr int kWM = kBM / kWarpsM, kWN = kBN / kWarpsN;  // 64 x 64 per warp
constexpr int kMT = kWM / 16, kNT = kWN / 8;              // 4 x 8 mma tiles per warp
constexpr int kGroupM = 8;                                // block rows per rasterisation group
constexpr int kChunk = 8;                                 // elements per 16-byte chunk
constexpr int kAChunksPerRow = kBK / kChunk;              // 8
constexpr int kBChunksPerRow = kBN / kChunk;              // 32
constexpr int kAChunksPerThread = kBM * kAChunksPerRow / kThreads;  // 4
constexpr int kBChunksPerThread = kBK * kBChunksPerRow / kThreads;  // 8
constexpr int kStageElems = kBM * kBK + kBK * kBN;
constexpr int kSmemBytes = kStages * kStageElems * 2;
static_assert(kWarpsM * kWarpsN * 32 == kThreads, "8 warps");
static_assert(kSmemBytes == 147456, "keep the metadata line's dynamic_smem in step");

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled tile with `chunks_per_row` chunks a
// row: the chunk index's low 3 bits are XORed with the row's, which permutes chunks within each group of
// 8 (128 bytes: all 32 banks) and so spreads any 8 consecutive rows of one column over all bank groups.
__device__ __forceinline__ int swizzled(int row, int chunk, int chunks_per_row) {
  return row * chunks_per_row * kChunk + ((chunk ^ (row & 7)) * kChunk);
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
rung6_kernel(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, const T* __restrict__ bias,
             int M, int N, int K, long long lda, long long ldb, long long ldc, int epilogue) {
  TF_DYNAMIC_SMEM(smem);
  T* const sA = reinterpret_cast<T*>(smem);       // [kStages][kBM][kBK], swizzled rows of 8 chunks
  T* const sB = sA + kStages * kBM * kBK;         // [kStages][kBK][kBN], swizzled rows of 32 chunks

  // Grouped rasterisation: consecutive blocks walk down kGroupM block rows before moving right.
  const int tiles_m = (M + kBM - 1) / kBM, tiles_n = (N + kBN - 1) / kBN;
  const int pid = blockIdx.x;
  const int per_group = kGroupM * tiles_n;
  const int first_m = (pid / per_group) * kGroupM;
  const int group_rows = min(tiles_m - first_m, kGroupM);
  const int tile_m = first_m + (pid % per_group) % group_rows;
  const int tile_n = (pid % per_group) / group_rows;
  const int m0 = tile_m * kBM, n0 = tile_n * kBN;

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;

  // Issue the cp.async of k-tile `kt` into `stage` (out-of-bounds chunks are zero-filled, reading nothing).
  auto load_tile = [&](int stage, int kt) {
    const int k0 = kt * kBK;
    T* const a_dst = sA + stage * kBM * kBK;
    T* const b_dst = sB + stage * kBK * kBN;
#pragma unroll
    for (int i = 0; i < kAChunksPerThread; ++i) {
      const int c = tid + i * kThreads;
      const int row = c / kAChunksPerRow, ck = c % kAChunksPerRow;
      const int gm = m0 + row, gk = k0 + ck * kChunk;
      const bool inside = gm < M && gk < K;
      cp_async_16(a_dst + swizzled(row, ck, kAChunksPerRow), inside ? A + gm * lda + gk : A, inside ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < kBChunksPerThread; ++i) {
      const int c = tid + i * kThreads;
      const int row = c / kBChunksPerRow, ck = c % kBChunksPerRow;
      const int gk = k0 + row, gn = n0 + ck * kChunk;
      const bool inside = gk < K && gn < N;
      cp_async_16(b_dst + swizzled(row, ck, kBChunksPerRow), inside ? B + gk * ldb + gn : B, inside ? 16 : 0);
    }
  };

  float acc[kMT][kNT][4];
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNT; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

  const int k_tiles = (K + kBK - 1) / kBK;
  // Prologue: tiles 0 .. kStages-2 in flight, one commit group each (empty groups keep the count right).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_tile(s, s);
    cp_async_commit();
  }

  // ldmatrix row addresses: lanes 0-15 give rows 0-15 of a 16-row slab at chunk 0, lanes 16-31 the same
  // rows at chunk 1 (A: the k 8..15 half; B: the n 8..15 half).
  const int ld_row = lane % 16, ld_chunk = lane / 16;

  for (int kt = 0; kt < k_tiles; ++kt) {
    // Groups committed so far: kStages - 1 + kt; tile kt is group kt, so kStages - 2 may stay pending.
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile kt visible to all warps; every warp is done with tile kt - 1's stage
    {
      const int next = kt + kStages - 1;
      if (next < k_tiles) load_tile(next % kStages, next);  // into the stage tile kt - 1 used
      cp_async_commit();
    }
    const T* const a_s = sA + (kt % kStages) * kBM * kBK;
    const T* const b_s = sB + (kt % kStages) * kBK * kBN;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[kMT][4];
      uint32_t bf[kNT][2];
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) {
        const int row = wm * kWM + mi * 16 + ld_row;
        ldmatrix_x4(af[mi], a_s + swizzled(row, ks * 2 + ld_chunk, kAChunksPerRow));
      }
#pragma unroll
      for (int nj = 0; nj < kNT / 2; ++nj) {
        const int krow = ks * 16 + ld_row;
        const int chunk = (wn * kWN + nj * 16) / kChunk + ld_chunk;
        uint32_t r[4];
        ldmatrix_x4_trans(r, b_s + swizzled(krow, chunk, kBChunksPerRow));
        // Matrices: 0 = (k 0-7, n 0-7), 1 = (k 8-15, n 0-7), 2 = (k 0-7, n 8-15), 3 = (k 8-15, n 8-15).
        bf[2 * nj][0] = r[0];
        bf[2 * nj][1] = r[1];
        bf[2 * nj + 1][0] = r[2];
        bf[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNT; ++ni) mma_16816<T>(acc[mi][ni], af[mi], bf[ni]);
    }
  }
  cp_async_wait<0>();  // nothing real is pending (only empty groups), but leave no copy behind

  // Epilogue straight from the accumulators: lane (g, c) holds columns 2c, 2c+1 of rows g and g+8 of each
  // mma tile; N % 8 == 0 and an even column make each pair wholly inside or outside.
  const int g = lane / 4, c2 = (lane % 4) * 2;
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = m0 + wm * kWM + mi * 16 + g + half * 8;
      if (row >= M) continue;
#pragma unroll
      for (int ni = 0; ni < kNT; ++ni) {
        const int col = n0 + wn * kWN + ni * 8 + c2;
        if (col >= N) continue;
        T pair[2];
        pair[0] = tf::from_float<T>(tf::epilogue_value(acc[mi][ni][2 * half], bias, col, epilogue));
        pair[1] = tf::from_float<T>(tf::epilogue_value(acc[mi][ni][2 * half + 1], bias, col + 1, epilogue));
        uint32_t packed;
        __builtin_memcpy(&packed, pair, sizeof(packed));
        *reinterpret_cast<uint32_t*>(C + row * ldc + col) = packed;
      }
    }
  }
}

// More than 48 KiB of dynamic shared memory must be asked for, once per kernel instance.
template <typename T>
int allow_shared_memory() {
  static int status = -1;
  if (status < 0)
    status = static_cast<int>(cudaFuncSetAttribute(rung6_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   kSmemBytes));
  return status;
}

}  // namespace

extern "C" int tilefuse_rung6_b_layout(void) { return 0; }

extern "C" int tilefuse_rung6_requirements(int* m_multiple, int* n_multiple, int* k_multiple) {
  *m_multiple = 1;
  *n_multiple = 8;
  *k_multiple = 8;
  return 0;
}

extern "C" int tilefuse_rung6(const void* A, const void* B, void* C, const void* bias, int M, int N, int K,
                              long long lda, long long ldb, long long ldc, int dtype, int epilogue, void* stream) {
  if (int bad = tf::check_args(A, B, C, bias, M, N, K, lda, ldb, ldc, dtype, epilogue, 0, 1, 8, 8)) return bad;
  if (lda % 8 || ldb % 8 || ldc % 2) return static_cast<int>(cudaErrorInvalidValue);  // 16-byte chunks, pair stores
  if (M == 0 || N == 0) return 0;
  return tf::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (int bad = allow_shared_memory<T>()) return bad;
    const long long tiles = static_cast<long long>(tf::ceil_div(M, kBM)) * tf::ceil_div(N, kBN);
    if (tiles > 0x7fffffffLL) return static_cast<int>(cudaErrorInvalidValue);
    TF_LAUNCH(rung6_kernel<T>, dim3(static_cast<unsigned int>(tiles)), dim3(kThreads), kSmemBytes, stream,
              static_cast<const T*>(A), static_cast<const T*>(B), static_cast<T*>(C),
              static_cast<const T*>(bias), M, N, K, lda, ldb, ldc, epilogue);
    return static_cast<int>(cudaGetLastError());
  });
}

// tilefuse: rung=5s arch=sm_80 portable=yes emulate=yes claims=FFMA
//
// Rung 5s, split-K across the lanes of a warp, written portably: the ladder's example of warp-level code
// that runs unchanged on NVIDIA (32 lanes) and AMD CDNA (64 lanes). A warp owns a 4x16 block of C and its
// lanes split K between them (lane l takes the 8-element K chunks l, l + warpSize, ...), each keeping 64
// partial sums; then the warp adds its partial sums with butterfly shuffles (tf::warp_allsum: the lane
// mask is ~lanemask_t(0) and the steps start at warpSize / 2, so on 64 lanes the 32-step is not lost) and
// the lanes share out the stores (element e is stored by lane e % warpSize).
// Adds over rung 5: a different axis of parallelism, not more speed on square GEMMs. With one warp per 4
// rows there is no reuse of B between rows beyond L1/L2, so at 4096^3 it is far behind rung 5; it is
// meant for skinny problems (small M, long K: decode-time projections), where B is read once and every
// lane streams it with 16-byte loads.
// Layouts: A [M,K], B [K,N], C [M,N] row-major; any M, N % 8 == 0, K % 8 == 0; bf16/fp16; every epilogue.
// Measured (H200, bf16, docs/decisions/001-ladder-rung-by-rung.md): 16x8192x8192 4.9 TFLOP/s (0.10x
//   cuBLAS).
#include "common.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kRows = 4;    // rows of C per warp
constexpr int kCols = 16;   // columns of C per warp: two 16-byte chunks of a B row (a full 32-byte sector)
constexpr int kChunk = 8;   // K elements per lane per step (one 16-byte load of an A row)

template <typename T>
__global__ void __launch_bounds__(kThreads)
rung5s_kernel(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, const T* __restrict__ bias,
              int M, int N, int K, long long lda, long long ldb, long long ldc, int epilogue, int rows_per_block) {
  const int lanes = warpSize;
  const int warps = blockDim.x / warpSize;
  const int warp = threadIdx.x / warpSize, lane = threadIdx.x % warpSize;
  const int n0 = blockIdx.x * kCols;
  const bool hi_inside = n0 + kChunk < N;  // N % 8 == 0: the second 8-column chunk is wholly in or out
  const int block_row0 = blockIdx.y * rows_per_block;
  const int block_rows_end = min(M, block_row0 + rows_per_block);
  // Warp-uniform loop bound: whole warps enter and leave together, as the shuffles below need.
  for (int r0 = block_row0 + warp * kRows; r0 < block_rows_end; r0 += warps * kRows) {
    float acc[kRows][kCols];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[r][c] = 0.0f;

    for (int k = lane * kChunk; k < K; k += lanes * kChunk) {
      float a[kRows][kChunk];
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        tf::unpack8<T>(tf::load8_or_zero(A + (r0 + r) * lda + k, r0 + r < M), a[r]);
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const T* brow = B + (k + j) * ldb + n0;
        float b[kCols];
        tf::unpack8<T>(tf::load8_or_zero(brow, true), b);
        tf::unpack8<T>(tf::load8_or_zero(brow + kChunk, hi_inside), b + kChunk);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int c = 0; c < kCols; ++c) acc[r][c] += a[r][j] * b[c];
      }
    }

#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float sum = tf::warp_allsum(acc[r][c]);  // every lane takes part, whatever it stores
        const int row = r0 + r, col = n0 + c;
        if ((r * kCols + c) % lanes == lane && row < M && col < N)
          C[row * ldc + col] = tf::from_float<T>(tf::epilogue_value(sum, bias, col, epilogue));
      }
    }
  }
}

}  // namespace

extern "C" int tilefuse_rung5s_b_layout(void) { return 0; }

extern "C" int tilefuse_rung5s_requirements(int* m_multiple, int* n_multiple, int* k_multiple) {
  *m_multiple = 1;
  *n_multiple = 8;
  *k_multiple = 8;
  return 0;
}

extern "C" int tilefuse_rung5s(const void* A, const void* B, void* C, const void* bias, int M, int N, int K,
                               long long lda, long long ldb, long long ldc, int dtype, int epilogue, void* stream) {
  if (int bad = tf::check_args(A, B, C, bias, M, N, K, lda, ldb, ldc, dtype, epilogue, 0, 1, 8, 8)) return bad;
  if (lda % 8 || ldb % 8) return static_cast<int>(cudaErrorInvalidValue);  // 16-byte rows
  if (M == 0 || N == 0) return 0;
  // The kernel loops over the rows of its block whatever the device's warp size turns out to be; this is
  // only the share of rows each block gets (one row group per warp when the guess is right).
  const int rows_per_block = kRows * (kThreads / TF_WARP_LANES);
  return tf::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(tf::ceil_div(N, kCols), tf::ceil_div(M, rows_per_block));
    TF_LAUNCH(rung5s_kernel<T>, grid, dim3(kThreads), 0, stream, static_cast<const T*>(A),
              static_cast<const T*>(B), static_cast<T*>(C), static_cast<const T*>(bias), M, N, K, lda, ldb, ldc,
              epilogue, rows_per_block);
    return static_cast<int>(cudaGetLastError());
  });
}

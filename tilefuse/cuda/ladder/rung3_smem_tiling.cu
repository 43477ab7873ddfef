// tilefuse: rung=3 arch=sm_80 portable=yes emulate=yes claims=FFMA
//
// Rung 3, shared-memory tiling: a block of 32x32 threads computes a 32x32 tile of C, walking K in steps
// of 32; each step the block stages a 32x32 tile of A and of B in shared memory (converted to fp32 once),
// then every thread reads its row of A and column of B from there. Adds over rung 2: each element
// loaded from global memory is reused 32 times (global traffic / 32). Now bound by shared-memory loads
// (2 per FMA) and one output per thread leaves no instruction-level parallelism: rung 4 fixes both.
// Layouts: A [M,K], B [K,N], C [M,N], all row-major; any M, N, K (edges zero-filled); bf16/fp16; every
// epilogue.
// Measured (H200, bf16, docs/decisions/001-ladder-rung-by-rung.md): 4096x4096x4096 6.9 TFLOP/s (0.01x
//   cuBLAS); 16x8192x8192 3.0 TFLOP/s (0.06x cuBLAS).
#include "common.cuh"

namespace {

constexpr int kTile = 32;  // BM = BN = BK; one thread per element of the C tile (1024 threads)

template <typename T>
__global__ void __launch_bounds__(kTile * kTile)
rung3_kernel(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, const T* __restrict__ bias,
             int M, int N, int K, long long lda, long long ldb, long long ldc, int epilogue) {
  // +1 column: the k loop reads As[ty][k] (one row, broadcast) and Bs[k][tx] (one row, consecutive): no
  // conflicts either way, but the stores As[ty][tx] of a transposed walk would conflict without it.
  __shared__ float As[kTile][kTile + 1];
  __shared__ float Bs[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * kTile + ty;
  const int col = blockIdx.x * kTile + tx;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    const int ka = k0 + tx, kb = k0 + ty;
    As[ty][tx] = (row < M && ka < K) ? tf::to_float(A[row * lda + ka]) : 0.0f;
    Bs[ty][tx] = (kb < K && col < N) ? tf::to_float(B[kb * ldb + col]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kTile; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();
  }
  if (row < M && col < N) C[row * ldc + col] = tf::from_float<T>(tf::epilogue_value(acc, bias, col, epilogue));
}

}  // namespace

extern "C" int tilefuse_rung3_b_layout(void) { return 0; }

extern "C" int tilefuse_rung3_requirements(int* m_multiple, int* n_multiple, int* k_multiple) {
  *m_multiple = 1;
  *n_multiple = 1;
  *k_multiple = 1;
  return 0;
}

extern "C" int tilefuse_rung3(const void* A, const void* B, void* C, const void* bias, int M, int N, int K,
                              long long lda, long long ldb, long long ldc, int dtype, int epilogue, void* stream) {
  if (int bad = tf::check_args(A, B, C, bias, M, N, K, lda, ldb, ldc, dtype, epilogue, 0, 1, 1, 1)) return bad;
  if (M == 0 || N == 0) return 0;
  return tf::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(tf::ceil_div(N, kTile), tf::ceil_div(M, kTile));
    const dim3 block(kTile, kTile);
    TF_LAUNCH(rung3_kernel<T>, grid, block, 0, stream, static_cast<const T*>(A), static_cast<const T*>(B),
              static_cast<T*>(C), static_cast<const T*>(bias), M, N, K, lda, ldb, ldc, epilogue);
    return static_cast<int>(cudaGetLastError());
  });
}

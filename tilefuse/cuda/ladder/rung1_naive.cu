// tilefuse: rung=1 arch=sm_80 portable=yes emulate=yes claims=FFMA
//
// Rung 1, naive: one thread per output element, a dot product over K read straight from global memory.
// Adds: nothing; it is the floor. Consecutive threads (threadIdx.x) take consecutive ROWS, so at each k
// the 32 lanes of a warp read A from 32 different rows (lda apart: one sector per lane) and write C 32 rows
// apart: every access is uncoalesced, which rung 2 fixes by swapping the mapping.
// Layouts: A [M,K] row-major, B [K,N] row-major, C [M,N] row-major; any M, N, K; bf16 or fp16 in and out,
// fp32 accumulation; epilogues none / +bias / gelu(+bias).
// Measured (H200, bf16, docs/decisions/001-ladder-rung-by-rung.md): 4096x4096x4096 1.0 TFLOP/s (0.00x
//   cuBLAS); 16x8192x8192 0.9 TFLOP/s (0.02x cuBLAS).
#include "common.cuh"

namespace {

constexpr int kBlockX = 16;  // rows per block
constexpr int kBlockY = 16;  // columns per block

template <typename T>
__global__ void rung1_kernel(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                             const T* __restrict__ bias, int M, int N, int K, long long lda, long long ldb,
                             long long ldc, int epilogue) {
  const int row = blockIdx.x * kBlockX + threadIdx.x;
  const int col = blockIdx.y * kBlockY + threadIdx.y;
  if (row >= M || col >= N) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc += tf::to_float(A[row * lda + k]) * tf::to_float(B[k * ldb + col]);
  C[row * ldc + col] = tf::from_float<T>(tf::epilogue_value(acc, bias, col, epilogue));
}

}  // namespace

extern "C" int tilefuse_rung1_b_layout(void) { return 0; }

extern "C" int tilefuse_rung1_requirements(int* m_multiple, int* n_multiple, int* k_multiple) {
  *m_multiple = 1;
  *n_multiple = 1;
  *k_multiple = 1;
  return 0;
}

extern "C" int tilefuse_rung1(const void* A, const void* B, void* C, const void* bias, int M, int N, int K,
                              long long lda, long long ldb, long long ldc, int dtype, int epilogue, void* stream) {
  if (int bad = tf::check_args(A, B, C, bias, M, N, K, lda, ldb, ldc, dtype, epilogue, 0, 1, 1, 1)) return bad;
  if (M == 0 || N == 0) return 0;
  return tf::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(tf::ceil_div(M, kBlockX), tf::ceil_div(N, kBlockY));
    const dim3 block(kBlockX, kBlockY);
    TF_LAUNCH(rung1_kernel<T>, grid, block, 0, stream, static_cast<const T*>(A), static_cast<const T*>(B),
              static_cast<T*>(C), static_cast<const T*>(bias), M, N, K, lda, ldb, ldc, epilogue);
    return static_cast<int>(cudaGetLastError());
  });
}

// tilefuse: rung=2 arch=sm_80 portable=yes emulate=yes claims=FFMA
//
// Rung 2, coalesced: still one thread per output element straight from global memory, but consecutive
// threads now take consecutive COLUMNS. Adds over rung 1: at each k a warp reads one contiguous run of B
// (a few sectors instead of one per lane), A[row, k] is one broadcast address, and C is written in
// contiguous runs. Same arithmetic, several times the useful bandwidth; still no data reuse, so it is
// bound by L1/L2 traffic (2 loads per FMA).
// Layouts: A [M,K], B [K,N], C [M,N], all row-major; any M, N, K; bf16/fp16; every epilogue.
// Measured (H200, bf16, docs/decisions/001-ladder-rung-by-rung.md): 4096x4096x4096 5.2 TFLOP/s (0.01x
//   cuBLAS); 16x8192x8192 3.8 TFLOP/s (0.08x cuBLAS).
#include "common.cuh"

namespace {

constexpr int kBlockX = 32;  // columns per block (the fast thread index walks along N)
constexpr int kBlockY = 8;   // rows per block

template <typename T>
__global__ void rung2_kernel(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                             const T* __restrict__ bias, int M, int N, int K, long long lda, long long ldb,
                             long long ldc, int epilogue) {
  const int col = blockIdx.x * kBlockX + threadIdx.x;
  const int row = blockIdx.y * kBlockY + threadIdx.y;
  if (row >= M || col >= N) return;
  const T* a = A + row * lda;
  const T* b = B + col;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc += tf::to_float(a[k]) * tf::to_float(b[k * ldb]);
  C[row * ldc + col] = tf::from_float<T>(tf::epilogue_value(acc, bias, col, epilogue));
}

}  // namespace

extern "C" int tilefuse_rung2_b_layout(void) { return 0; }

extern "C" int tilefuse_rung2_requirements(int* m_multiple, int* n_multiple, int* k_multiple) {
  *m_multiple = 1;
  *n_multiple = 1;
  *k_multiple = 1;
  return 0;
}

extern "C" int tilefuse_rung2(const void* A, const void* B, void* C, const void* bias, int M, int N, int K,
                              long long lda, long long ldb, long long ldc, int dtype, int epilogue, void* stream) {
  if (int bad = tf::check_args(A, B, C, bias, M, N, K, lda, ldb, ldc, dtype, epilogue, 0, 1, 1, 1)) return bad;
  if (M == 0 || N == 0) return 0;
  return tf::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(tf::ceil_div(N, kBlockX), tf::ceil_div(M, kBlockY));
    const dim3 block(kBlockX, kBlockY);
    TF_LAUNCH(rung2_kernel<T>, grid, block, 0, stream, static_cast<const T*>(A), static_cast<const T*>(B),
              static_cast<T*>(C), static_cast<const T*>(bias), M, N, K, lda, ldb, ldc, epilogue);
    return static_cast<int>(cudaGetLastError());
  });
}

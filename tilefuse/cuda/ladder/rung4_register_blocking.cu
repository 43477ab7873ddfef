// tilefuse: rung=4 arch=sm_80 portable=yes emulate=yes claims=FFMA
//
// Rung 4, 2-D register blocking with vectorised loads: 256 threads compute a 128x128 tile of C, each
// thread an 8x8 block of it held in 64 fp32 registers. Per k the thread reads 8 values of A and 8 of B
// from shared memory (four 16-byte float4 reads) and does 64 FMAs: 16 FMAs per shared load instead of
// rung 3's 0.5. Global loads are 16 bytes a thread (8 bf16/fp16 elements, coalesced), A is stored
// transposed (As[k][m]) so both operands are read as float4 along the thread's rows/columns.
// Adds over rung 3: register reuse (ILP and 32x less shared traffic per FMA) and 16-byte loads.
// Each thread's 8 rows are two groups of 4 (ty*4 and 64+ty*4), likewise its columns, so that the 8 threads
// of a float4 phase read 8 consecutive 16-byte words of a shared row: no bank conflicts.
// Layouts: A [M,K], B [K,N], C [M,N] row-major; any M, N % 8 == 0, K % 8 == 0 (16-byte chunks; M and the
// tile edges are zero-filled); bf16/fp16; every epilogue.
// Measured (H200, bf16, docs/decisions/001-ladder-rung-by-rung.md): 4096x4096x4096 43.5 TFLOP/s (0.06x
//   cuBLAS); 8192x8192x8192 43.1 TFLOP/s (0.06x cuBLAS); 16384x4096x4096 43.6 TFLOP/s (0.06x cuBLAS); 16x8192x8192
//   1.9 TFLOP/s (0.04x cuBLAS).
#include "common.cuh"

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 16;
constexpr int kThreads = 256;          // a 16 x 16 grid of threads
constexpr int kTM = 8, kTN = 8;        // outputs per thread
constexpr int kHalfM = kBM / 2, kHalfN = kBN / 2;
static_assert((kBM / kTM) * (kBN / kTN) == kThreads, "one thread per 8x8 block of the tile");
static_assert(kBM * kBK / 8 == kThreads && kBK * kBN / 8 == kThreads, "one 16-byte chunk of A and of B per thread");

template <typename T>
__global__ void __launch_bounds__(kThreads)
rung4_kernel(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, const T* __restrict__ bias,
             int M, int N, int K, long long lda, long long ldb, long long ldc, int epilogue) {
  __shared__ __align__(16) float As[kBK][kBM];  // transposed: As[k][m]
  __shared__ __align__(16) float Bs[kBK][kBN];
  const int tid = threadIdx.x;
  const int tx = tid % (kBN / kTN), ty = tid / (kBN / kTN);
  const int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;
  // This thread's 16-byte chunks: A row a_row, k chunk a_kc; B k-row b_row, n chunk b_nc.
  const int a_row = tid / (kBK / 8), a_kc = tid % (kBK / 8);
  const int b_row = tid / (kBN / 8), b_nc = tid % (kBN / 8);

  float acc[kTM][kTN];
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) acc[i][j] = 0.0f;

  for (int k0 = 0; k0 < K; k0 += kBK) {
    {
      const int gm = m0 + a_row, gk = k0 + a_kc * 8;
      float v[8];
      tf::unpack8<T>(tf::load8_or_zero(A + gm * lda + gk, gm < M && gk < K), v);
#pragma unroll
      for (int i = 0; i < 8; ++i) As[a_kc * 8 + i][a_row] = v[i];
    }
    {
      const int gk = k0 + b_row, gn = n0 + b_nc * 8;
      float v[8];
      tf::unpack8<T>(tf::load8_or_zero(B + gk * ldb + gn, gk < K && gn < N), v);
      *reinterpret_cast<float4*>(&Bs[b_row][b_nc * 8]) = make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(&Bs[b_row][b_nc * 8 + 4]) = make_float4(v[4], v[5], v[6], v[7]);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
      const float4 a_lo = *reinterpret_cast<const float4*>(&As[k][ty * 4]);
      const float4 a_hi = *reinterpret_cast<const float4*>(&As[k][kHalfM + ty * 4]);
      const float4 b_lo = *reinterpret_cast<const float4*>(&Bs[k][tx * 4]);
      const float4 b_hi = *reinterpret_cast<const float4*>(&Bs[k][kHalfN + tx * 4]);
      const float a[kTM] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w, a_hi.x, a_hi.y, a_hi.z, a_hi.w};
      const float b[kTN] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int row = m0 + (i < 4 ? ty * 4 + i : kHalfM + ty * 4 + i - 4);
    if (row >= M) continue;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int col = n0 + (j < 4 ? tx * 4 + j : kHalfN + tx * 4 + j - 4);
      if (col < N) C[row * ldc + col] = tf::from_float<T>(tf::epilogue_value(acc[i][j], bias, col, epilogue));
    }
  }
}

}  // namespace

extern "C" int tilefuse_rung4_b_layout(void) { return 0; }

extern "C" int tilefuse_rung4_requirements(int* m_multiple, int* n_multiple, int* k_multiple) {
  *m_multiple = 1;
  *n_multiple = 8;
  *k_multiple = 8;
  return 0;
}

extern "C" int tilefuse_rung4(const void* A, const void* B, void* C, const void* bias, int M, int N, int K,
                              long long lda, long long ldb, long long ldc, int dtype, int epilogue, void* stream) {
  if (int bad = tf::check_args(A, B, C, bias, M, N, K, lda, ldb, ldc, dtype, epilogue, 0, 1, 8, 8)) return bad;
  if (lda % 8 || ldb % 8) return static_cast<int>(cudaErrorInvalidValue);  // 16-byte rows
  if (M == 0 || N == 0) return 0;
  return tf::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(tf::ceil_div(N, kBN), tf::ceil_div(M, kBM));
    TF_LAUNCH(rung4_kernel<T>, grid, dim3(kThreads), 0, stream, static_cast<const T*>(A),
              static_cast<const T*>(B), static_cast<T*>(C), static_cast<const T*>(bias), M, N, K, lda, ldb, ldc,
              epilogue);
    return static_cast<int>(cudaGetLastError());
  });
}

// tilefuse: rung=5 arch=sm_80 portable=yes emulate=yes claims=FFMA
//
// Rung 5, warp tiling: the 128x128 block tile is split into one sub-tile per warp (32x64 on NVIDIA's 32
// lanes, 64x64 on AMD's 64), and each warp's lanes are laid out 8 wide along N over it, every lane owning
// an 8x8 block of C. Adds over rung 4:
//   * fewer distinct shared-memory words per warp and k (A: 4 float4 words instead of 2 rows x 2 halves
//     spread over the whole block width; B: 8 words of one warp column), so the shared reads of a warp
//     are mostly broadcasts, and the warp's outputs are a compact block (the shape the tensor-core rung
//     keeps);
//   * double-buffered shared memory with the next K tile staged in registers: the global loads of tile
//     k+1 are issued before the FMAs of tile k and land in the other buffer after them, so memory latency
//     hides behind arithmetic and there is one barrier per tile instead of two.
// Portable: the lane layout is derived from TF_WARP_LANES (common.cuh: 32 on NVIDIA, 64 on AMD CDNA), and
// no warp-synchronous operation depends on it, so the kernel is right for any lane count.
// Layouts: A [M,K], B [K,N], C [M,N] row-major; any M, N % 8 == 0, K % 8 == 0; bf16/fp16; every epilogue.
// Measured (H200, bf16, docs/decisions/001-ladder-rung-by-rung.md): 4096x4096x4096 46.5 TFLOP/s (0.06x
//   cuBLAS); 8192x8192x8192 46.9 TFLOP/s (0.07x cuBLAS); 16384x4096x4096 46.4 TFLOP/s (0.07x cuBLAS); 16x8192x8192
//   2.1 TFLOP/s (0.04x cuBLAS).
#include "common.cuh"

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 16;
constexpr int kThreads = 256;
constexpr int kLanes = TF_WARP_LANES;
constexpr int kWarps = kThreads / kLanes;                 // 8 on NVIDIA, 4 on AMD CDNA
constexpr int kWarpsN = 2, kWarpsM = kWarps / kWarpsN;    // warps over the block tile
constexpr int kWM = kBM / kWarpsM, kWN = kBN / kWarpsN;   // a warp's sub-tile: 32x64 (NVIDIA), 64x64 (AMD)
constexpr int kLanesN = 8, kLanesM = kLanes / kLanesN;    // lanes over the warp's sub-tile
constexpr int kTM = kWM / kLanesM, kTN = kWN / kLanesN;   // outputs per thread: 8 x 8 either way
static_assert(kTM == 8 && kTN == 8, "each thread owns two 4-row by two 4-column groups");
static_assert(kBM * kBK / 8 == kThreads && kBK * kBN / 8 == kThreads, "one 16-byte chunk of A and of B per thread");

template <typename T>
__global__ void __launch_bounds__(kThreads)
rung5_kernel(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, const T* __restrict__ bias,
             int M, int N, int K, long long lda, long long ldb, long long ldc, int epilogue) {
  __shared__ __align__(16) float As[2][kBK][kBM];  // transposed: As[stage][k][m]
  __shared__ __align__(16) float Bs[2][kBK][kBN];
  const int tid = threadIdx.x;
  const int warp = tid / kLanes, lane = tid % kLanes;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  const int lane_m = lane / kLanesN, lane_n = lane % kLanesN;
  const int row_base = warp_m * kWM + lane_m * 4;  // rows row_base + 0..3 and row_base + kWM/2 + 0..3
  const int col_base = warp_n * kWN + lane_n * 4;  // columns col_base + 0..3 and col_base + kWN/2 + 0..3
  const int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;
  const int a_row = tid / (kBK / 8), a_kc = tid % (kBK / 8);
  const int b_row = tid / (kBN / 8), b_nc = tid % (kBN / 8);

  auto fetch = [&](int k0, uint4& ra, uint4& rb) {
    const int gm = m0 + a_row, gka = k0 + a_kc * 8;
    ra = tf::load8_or_zero(A + gm * lda + gka, gm < M && gka < K);
    const int gkb = k0 + b_row, gn = n0 + b_nc * 8;
    rb = tf::load8_or_zero(B + gkb * ldb + gn, gkb < K && gn < N);
  };
  auto stash = [&](int stage, const uint4& ra, const uint4& rb) {
    float v[8];
    tf::unpack8<T>(ra, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) As[stage][a_kc * 8 + i][a_row] = v[i];
    tf::unpack8<T>(rb, v);
    *reinterpret_cast<float4*>(&Bs[stage][b_row][b_nc * 8]) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(&Bs[stage][b_row][b_nc * 8 + 4]) = make_float4(v[4], v[5], v[6], v[7]);
  };

  float acc[kTM][kTN];
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) acc[i][j] = 0.0f;

  const int k_tiles = (K + kBK - 1) / kBK;
  uint4 ra, rb;
  if (k_tiles > 0) {
    fetch(0, ra, rb);
    stash(0, ra, rb);
  }
  __syncthreads();
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int stage = kt % 2;
    const bool more = kt + 1 < k_tiles;
    if (more) fetch((kt + 1) * kBK, ra, rb);  // in flight during the FMAs below
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
      const float4 a_lo = *reinterpret_cast<const float4*>(&As[stage][k][row_base]);
      const float4 a_hi = *reinterpret_cast<const float4*>(&As[stage][k][row_base + kWM / 2]);
      const float4 b_lo = *reinterpret_cast<const float4*>(&Bs[stage][k][col_base]);
      const float4 b_hi = *reinterpret_cast<const float4*>(&Bs[stage][k][col_base + kWN / 2]);
      const float a[kTM] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w, a_hi.x, a_hi.y, a_hi.z, a_hi.w};
      const float b[kTN] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] += a[i] * b[j];
    }
    // The other stage was last read in iteration kt - 1, before the barrier that ended it.
    if (more) stash(stage ^ 1, ra, rb);
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int row = m0 + row_base + (i < 4 ? i : kWM / 2 + i - 4);
    if (row >= M) continue;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int col = n0 + col_base + (j < 4 ? j : kWN / 2 + j - 4);
      if (col < N) C[row * ldc + col] = tf::from_float<T>(tf::epilogue_value(acc[i][j], bias, col, epilogue));
    }
  }
}

}  // namespace

extern "C" int tilefuse_rung5_b_layout(void) { return 0; }

extern "C" int tilefuse_rung5_requirements(int* m_multiple, int* n_multiple, int* k_multiple) {
  *m_multiple = 1;
  *n_multiple = 8;
  *k_multiple = 8;
  return 0;
}

extern "C" int tilefuse_rung5(const void* A, const void* B, void* C, const void* bias, int M, int N, int K,
                              long long lda, long long ldb, long long ldc, int dtype, int epilogue, void* stream) {
  if (int bad = tf::check_args(A, B, C, bias, M, N, K, lda, ldb, ldc, dtype, epilogue, 0, 1, 8, 8)) return bad;
  if (lda % 8 || ldb % 8) return static_cast<int>(cudaErrorInvalidValue);  // 16-byte rows
  if (M == 0 || N == 0) return 0;
  return tf::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(tf::ceil_div(N, kBN), tf::ceil_div(M, kBM));
    TF_LAUNCH(rung5_kernel<T>, grid, dim3(kThreads), 0, stream, static_cast<const T*>(A),
              static_cast<const T*>(B), static_cast<T*>(C), static_cast<const T*>(bias), M, N, K, lda, ldb, ldc,
              epilogue);
    return static_cast<int>(cudaGetLastError());
  });
}

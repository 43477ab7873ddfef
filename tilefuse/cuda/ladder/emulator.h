// tilefuse: header portable=no reason="host-side emulator of NVIDIA's 32-lane warps, for CPU tests of the rungs; never compiled for a GPU"
//
// A small SIMT emulator that lets a rung's .cu file compile as plain host C++ (build.py, emulate=True:
// g++ -x c++ -DTILEFUSE_CPU_EMULATION) and run on CPU tensors through the same C ABI, so that the index
// arithmetic, edge handling, shared-memory swizzles, cp.async pipelines and mma fragment layouts of the
// ladder are checked in CI, where there is no GPU.
//
// How: blocks run one after another; the threads of a block are cooperative user-level contexts
// (ucontext), switched at every __syncthreads and every warp-collective operation (shuffles, ldmatrix,
// mma.sync). A collective is an exchange: each lane posts its operands to its warp's slots, waits until all
// lanes have, computes its own result from the slots, and waits again before the slots are reused.
// The sm_80 instructions follow the PTX ISA's documented fragment layouts (see mma_sm80.cuh).
// cp.async copies either complete at issue ("eager": exposes a stage overwritten while another warp still
// reads it) or only when a cp.async.wait_group retires their group ("lazy": exposes a read before its
// wait); tests run both. Dynamic shared memory starts as 0xFF bytes (NaN in bf16 and fp16), so a read of
// a never-written element shows up in the output. ldmatrix row addresses are checked for alignment and
// bounds, and their bank conflicts counted (the swizzle should leave none).
//
// What it is not: a timing model, or a check of the real instructions' encoding. A rung right here can
// still be wrong on the GPU if this file's reading of the ISA is; the GPU tests are the final word.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static  // blocks run one at a time, so a static is the block's shared variable
#define __syncthreads() ::tf_emu::syncthreads()
#define warpSize 32
#define threadIdx (::tf_emu::current()->thread_idx)
#define blockIdx (::tf_emu::block().block_idx)
#define blockDim (::tf_emu::block().block_dim)
#define gridDim (::tf_emu::block().grid_dim)

using std::max;
using std::min;

// ------------------------------------------------------------------------------ CUDA runtime subset
struct dim3 {
  unsigned int x, y, z;
  dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
typedef void* cudaStream_t;

struct __attribute__((aligned(16))) uint4 { unsigned int x, y, z, w; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

struct __nv_bfloat16 { uint16_t bits; };
struct __half { uint16_t bits; };

inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16(float f) {  // round to nearest even, NaN stays a (quiet) NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return __nv_bfloat16{static_cast<uint16_t>(u >> 16)};
}
inline float __half2float(__half h) {
  _Float16 v;
  std::memcpy(&v, &h.bits, 2);
  return static_cast<float>(v);
}
inline __half __float2half(float f) {
  _Float16 v = static_cast<_Float16>(f);
  __half h;
  std::memcpy(&h.bits, &v, 2);
  return h;
}

namespace tf_emu {

constexpr int kLanes = 32;
constexpr size_t kStackBytes = 256 << 10;
constexpr size_t kMaxDynamicSmem = 227 << 10;  // what an H100/H200 block may opt in to
constexpr size_t kSlotBytes = 64;
constexpr long long kMaxIdleRounds = 4;  // scheduler rounds with no barrier released before "deadlock"

struct Copy {
  void* dst;
  const void* src;
  int src_bytes;
};

struct Thread {
  ucontext_t ctx;
  dim3 thread_idx;
  int linear = 0;
  bool done = false;
  std::vector<Copy> open_group;           // issued since the last commit
  std::deque<std::vector<Copy>> groups;   // committed, not yet retired
};

struct Warp {
  int arrived = 0;
  long long generation = 0;
  int lanes = 0;
  int live = 0;
  unsigned char slots[kLanes][kSlotBytes];
};

struct Block {
  dim3 block_idx, block_dim, grid_dim;
  int threads = 0, live = 0, arrived = 0;
  long long generation = 0;
  std::vector<Warp> warps;
};

struct State {
  Block block;
  std::vector<Thread> threads;
  // Thread stacks, allocated uninitialised: the pages a thread never touches are never backed by memory
  // (a zero-filled vector made rung 3's 1024 x 256 KiB resident).
  std::vector<std::unique_ptr<char[]>> stacks;
  Thread* cur = nullptr;
  ucontext_t scheduler;
  const std::function<void()>* body = nullptr;
  unsigned char* dyn_smem = nullptr;
  size_t dyn_smem_bytes = 0;
  cudaError_t last_error = cudaSuccess;
  long long progress = 0;
  bool abandon = false;
  // settings and counters, read and set through tilefuse_emu_stat / tilefuse_emu_set
  long long lazy_copies = 0;
  long long launches = 0, ldmatrix_ops = 0, ldmatrix_conflicts = 0, mma_ops = 0, shfl_ops = 0;
  long long cp_async_ops = 0, bad_addresses = 0, deadlocks = 0;
};

// static: each rung library keeps its own emulator (a shared one would tie libraries built from different
// emulator.h versions to one layout).
static inline State& state() {
  static State s;
  return s;
}
inline Thread* current() { return state().cur; }
inline Block& block() { return state().block; }
inline unsigned char* dynamic_smem() { return state().dyn_smem; }

inline void fail(cudaError_t code, const char* what) {
  State& s = state();
  if (s.last_error == cudaSuccess) s.last_error = code;
  std::fprintf(stderr, "[tilefuse emulator] %s\n", what);
}

inline void yield() {
  State& s = state();
  Thread* self = s.cur;
  swapcontext(&self->ctx, &s.scheduler);
  if (s.abandon) {  // the launch gave up on this block: never return into the kernel
    for (;;) swapcontext(&self->ctx, &s.scheduler);
  }
}

inline Warp& my_warp() { return state().block.warps[current()->linear / kLanes]; }
inline int my_lane() { return current()->linear % kLanes; }

inline void syncthreads() {
  Block& b = block();
  const long long gen = b.generation;
  if (++b.arrived >= b.live) {
    b.arrived = 0;
    ++b.generation;
    ++state().progress;
    return;
  }
  while (b.generation == gen) yield();
}

inline void warp_barrier() {
  Warp& w = my_warp();
  const long long gen = w.generation;
  if (++w.arrived >= w.live) {
    w.arrived = 0;
    ++w.generation;
    ++state().progress;
    return;
  }
  while (w.generation == gen) yield();
}

// Post `in` to this lane's slot; once every lane has, call f(slots) and return its result.
template <typename In, typename F>
inline auto exchange(const In& in, F&& f) {
  static_assert(sizeof(In) <= kSlotBytes, "operands fit a slot");
  Warp& w = my_warp();
  std::memcpy(w.slots[my_lane()], &in, sizeof(In));
  warp_barrier();
  auto out = f(w.slots);
  warp_barrier();
  return out;
}

template <typename In>
inline In slot(const unsigned char (*slots)[kSlotBytes], int lane) {
  In v;
  std::memcpy(&v, slots[lane], sizeof(In));
  return v;
}

inline void entry() {
  State& s = state();
  (*s.body)();
  s.cur->done = true;
  Block& b = s.block;
  --b.live;
  Warp& w = my_warp();
  --w.live;
  // A barrier that was waiting only for this thread is now complete.
  if (b.arrived > 0 && b.arrived >= b.live) {
    b.arrived = 0;
    ++b.generation;
  }
  if (w.arrived > 0 && w.arrived >= w.live) {
    w.arrived = 0;
    ++w.generation;
  }
  ++s.progress;
  swapcontext(&s.cur->ctx, &s.scheduler);
}

inline void run_block(dim3 block_idx) {
  State& s = state();
  Block& b = s.block;
  b.block_idx = block_idx;
  b.arrived = 0;
  b.generation = 0;
  b.live = b.threads;
  const int n_warps = (b.threads + kLanes - 1) / kLanes;
  b.warps.assign(n_warps, Warp());
  for (int w = 0; w < n_warps; ++w) b.warps[w].lanes = b.warps[w].live = std::min(kLanes, b.threads - w * kLanes);
  s.threads.assign(b.threads, Thread());
  if (s.stacks.size() < static_cast<size_t>(b.threads)) s.stacks.resize(b.threads);
  for (int t = 0; t < b.threads; ++t) {
    Thread& th = s.threads[t];
    th.linear = t;
    th.thread_idx = dim3(t % b.block_dim.x, (t / b.block_dim.x) % b.block_dim.y, t / (b.block_dim.x * b.block_dim.y));
    if (!s.stacks[t]) s.stacks[t].reset(new char[kStackBytes]);
    getcontext(&th.ctx);
    th.ctx.uc_stack.ss_sp = s.stacks[t].get();
    th.ctx.uc_stack.ss_size = kStackBytes;
    th.ctx.uc_link = &s.scheduler;
    makecontext(&th.ctx, entry, 0);
  }
  long long idle_rounds = 0;
  for (;;) {
    bool alive = false;
    const long long before = s.progress;
    for (Thread& th : s.threads) {
      if (th.done) continue;
      alive = true;
      s.cur = &th;
      swapcontext(&s.scheduler, &th.ctx);
    }
    s.cur = nullptr;
    if (!alive) break;
    idle_rounds = s.progress == before ? idle_rounds + 1 : 0;
    if (idle_rounds > kMaxIdleRounds) {
      ++s.deadlocks;
      fail(cudaErrorLaunchFailure, "deadlock: threads wait at a barrier or collective that the others never reach");
      // Let each waiting context park for good; their stacks are simply reused by the next block.
      s.abandon = true;
      for (Thread& th : s.threads) {
        if (th.done) continue;
        s.cur = &th;
        swapcontext(&s.scheduler, &th.ctx);
      }
      s.abandon = false;
      s.cur = nullptr;
      break;
    }
  }
}

inline void launch(dim3 grid, dim3 block_dim, size_t smem, const std::function<void()>& body) {
  State& s = state();
  ++s.launches;
  const long long threads = 1LL * block_dim.x * block_dim.y * block_dim.z;
  if (threads < 1 || threads > 1024 || grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.y > 65535 || grid.z > 65535) {
    fail(cudaErrorInvalidConfiguration, "invalid launch configuration");
    return;
  }
  if (smem > kMaxDynamicSmem) {
    fail(cudaErrorInvalidValue, "more dynamic shared memory than a block may have");
    return;
  }
  std::free(s.dyn_smem);
  s.dyn_smem_bytes = smem;
  s.dyn_smem = static_cast<unsigned char*>(std::aligned_alloc(128, std::max<size_t>(128, (smem + 127) / 128 * 128)));
  std::memset(s.dyn_smem, 0xff, smem);  // 0xffff is NaN in bf16 and fp16: unwritten reads show
  s.block.block_dim = block_dim;
  s.block.grid_dim = grid;
  s.block.threads = static_cast<int>(threads);
  s.body = &body;
  for (unsigned z = 0; z < grid.z && s.last_error == cudaSuccess; ++z)
    for (unsigned y = 0; y < grid.y && s.last_error == cudaSuccess; ++y)
      for (unsigned x = 0; x < grid.x && s.last_error == cudaSuccess; ++x) run_block(dim3(x, y, z));
  s.body = nullptr;
}

inline bool in_dynamic_smem(const void* p, size_t bytes) {
  const unsigned char* c = static_cast<const unsigned char*>(p);
  const State& s = state();
  return c >= s.dyn_smem && c + bytes <= s.dyn_smem + s.dyn_smem_bytes;
}

inline uint16_t bits16(const void* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

template <typename T> float element(uint16_t bits);
template <> inline float element<__nv_bfloat16>(uint16_t bits) { return __bfloat162float(__nv_bfloat16{bits}); }
template <> inline float element<__half>(uint16_t bits) { return __half2float(__half{bits}); }

}  // namespace tf_emu

// --------------------------------------------------------------------------------- warp shuffles
inline float __shfl_down_sync(unsigned int mask, float v, int delta) {
  (void)mask;
  ++tf_emu::state().shfl_ops;
  const int lane = tf_emu::my_lane();
  return tf_emu::exchange(v, [&](const unsigned char (*slots)[tf_emu::kSlotBytes]) {
    const int src = lane + delta < tf_emu::my_warp().lanes ? lane + delta : lane;
    return tf_emu::slot<float>(slots, src);
  });
}

inline float __shfl_xor_sync(unsigned int mask, float v, int lane_mask) {
  (void)mask;
  ++tf_emu::state().shfl_ops;
  const int lane = tf_emu::my_lane();
  return tf_emu::exchange(v, [&](const unsigned char (*slots)[tf_emu::kSlotBytes]) {
    const int src = lane ^ lane_mask;
    return tf_emu::slot<float>(slots, src < tf_emu::my_warp().lanes ? src : lane);
  });
}

inline cudaError_t cudaGetLastError() {
  cudaError_t e = tf_emu::state().last_error;
  tf_emu::state().last_error = cudaSuccess;
  return e;
}

inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
  }
  return "unknown error";
}

template <typename F>
inline cudaError_t cudaFuncSetAttribute(F*, cudaFuncAttribute, int value) {
  return value >= 0 && static_cast<size_t>(value) <= tf_emu::kMaxDynamicSmem ? cudaSuccess : cudaErrorInvalidValue;
}

// ------------------------------------------------------------------------------ sm_80 instructions
namespace tf {
namespace sm80 {

inline void cp_async_16(void* smem, const void* gmem, int src_bytes) {
  tf_emu::State& s = tf_emu::state();
  ++s.cp_async_ops;
  if (reinterpret_cast<uintptr_t>(smem) % 16 || (src_bytes && reinterpret_cast<uintptr_t>(gmem) % 16) ||
      !tf_emu::in_dynamic_smem(smem, 16) || src_bytes < 0 || src_bytes > 16) {
    ++s.bad_addresses;
    tf_emu::fail(cudaErrorIllegalAddress, "cp.async: misaligned or out-of-range address");
    return;
  }
  tf_emu::Copy c{smem, gmem, src_bytes};
  if (s.lazy_copies) {
    tf_emu::current()->open_group.push_back(c);
  } else {
    std::memset(smem, 0, 16);
    if (src_bytes) std::memcpy(smem, gmem, src_bytes);
  }
}

inline void cp_async_commit() {
  tf_emu::Thread* t = tf_emu::current();
  t->groups.push_back(std::move(t->open_group));
  t->open_group.clear();
}

template <int kPending>
inline void cp_async_wait() {
  tf_emu::Thread* t = tf_emu::current();
  while (t->groups.size() > static_cast<size_t>(kPending)) {
    for (tf_emu::Copy& c : t->groups.front()) {
      std::memset(c.dst, 0, 16);
      if (c.src_bytes) std::memcpy(c.dst, c.src, c.src_bytes);
    }
    t->groups.pop_front();
  }
}

// Shared by ldmatrix .x4 and .x4.trans: lane l posts row address l; matrix i's row r is lane 8i + r's.
inline void ldmatrix_x4_impl(uint32_t r[4], const void* smem, bool trans) {
  tf_emu::State& s = tf_emu::state();
  ++s.ldmatrix_ops;
  const int lane = tf_emu::my_lane();
  if (reinterpret_cast<uintptr_t>(smem) % 16 || !tf_emu::in_dynamic_smem(smem, 16)) {
    ++s.bad_addresses;
    tf_emu::fail(cudaErrorIllegalAddress, "ldmatrix: misaligned or out-of-range row address");
    smem = s.dyn_smem;  // read something harmless; the launch already reports the error
  }
  struct Out { uint32_t r[4]; };
  const Out out = tf_emu::exchange(smem, [&](const unsigned char (*slots)[tf_emu::kSlotBytes]) {
    Out o{};
    const int g = lane / 4, c = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const unsigned char* rows[8];
      for (int row = 0; row < 8; ++row) rows[row] = static_cast<const unsigned char*>(tf_emu::slot<const void*>(slots, 8 * i + row));
      if (lane == 0) {  // bank conflicts of this matrix's 8 row reads (16 bytes each; base 128-aligned)
        int used[8] = {0};
        for (int row = 0; row < 8; ++row) {
          const int group = static_cast<int>((reinterpret_cast<uintptr_t>(rows[row]) / 16) % 8);
          bool duplicate_row = false;
          for (int prev = 0; prev < row; ++prev) duplicate_row |= rows[prev] == rows[row];
          if (!duplicate_row) ++used[group];
        }
        for (int grp = 0; grp < 8; ++grp)
          if (used[grp] > 1) s.ldmatrix_conflicts += used[grp] - 1;
      }
      uint16_t lo, hi;
      if (!trans) {  // row g, columns 2c and 2c + 1
        lo = tf_emu::bits16(rows[g] + 4 * c);
        hi = tf_emu::bits16(rows[g] + 4 * c + 2);
      } else {       // rows 2c and 2c + 1, column g
        lo = tf_emu::bits16(rows[2 * c] + 2 * g);
        hi = tf_emu::bits16(rows[2 * c + 1] + 2 * g);
      }
      o.r[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
    return o;
  });
  for (int i = 0; i < 4; ++i) r[i] = out.r[i];
}

inline void ldmatrix_x4(uint32_t r[4], const void* smem) { ldmatrix_x4_impl(r, smem, false); }
inline void ldmatrix_x4_trans(uint32_t r[4], const void* smem) { ldmatrix_x4_impl(r, smem, true); }

// m16n8k16, A row-major, B "col", fp32 accumulate; fragment layouts as in mma_sm80.cuh.
template <typename T>
inline void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  ++tf_emu::state().mma_ops;
  struct In { uint32_t a[4], b[2]; };
  struct Out { float d[4]; };
  In in;
  for (int i = 0; i < 4; ++i) in.a[i] = a[i];
  in.b[0] = b[0];
  in.b[1] = b[1];
  const int lane = tf_emu::my_lane();
  const Out prod = tf_emu::exchange(in, [&](const unsigned char (*slots)[tf_emu::kSlotBytes]) {
    float As[16][16], Bs[16][8];
    for (int t = 0; t < 32; ++t) {
      const In v = tf_emu::slot<In>(slots, t);
      const int g = t / 4, c = t % 4;
      auto lo = [](uint32_t x) { return tf_emu::element<T>(static_cast<uint16_t>(x & 0xffffu)); };
      auto hi = [](uint32_t x) { return tf_emu::element<T>(static_cast<uint16_t>(x >> 16)); };
      As[g][2 * c] = lo(v.a[0]);         As[g][2 * c + 1] = hi(v.a[0]);
      As[g + 8][2 * c] = lo(v.a[1]);     As[g + 8][2 * c + 1] = hi(v.a[1]);
      As[g][2 * c + 8] = lo(v.a[2]);     As[g][2 * c + 9] = hi(v.a[2]);
      As[g + 8][2 * c + 8] = lo(v.a[3]); As[g + 8][2 * c + 9] = hi(v.a[3]);
      Bs[2 * c][g] = lo(v.b[0]);         Bs[2 * c + 1][g] = hi(v.b[0]);
      Bs[2 * c + 8][g] = lo(v.b[1]);     Bs[2 * c + 9][g] = hi(v.b[1]);
    }
    const int g = lane / 4, c = lane % 4;
    Out o;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * c, 2 * c + 1, 2 * c, 2 * c + 1};
    for (int e = 0; e < 4; ++e) {
      float sum = 0.0f;
      for (int k = 0; k < 16; ++k) sum += As[rows[e]][k] * Bs[k][cols[e]];
      o.d[e] = sum;
    }
    return o;
  });
  for (int e = 0; e < 4; ++e) d[e] += prod.d[e];
}

}  // namespace sm80
}  // namespace tf

// ------------------------------------------------------------------------- counters and settings
extern "C" __attribute__((weak)) long long tilefuse_emu_stat(const char* name) {
  const tf_emu::State& s = tf_emu::state();
  const struct { const char* name; long long value; } table[] = {
      {"launches", s.launches}, {"ldmatrix_ops", s.ldmatrix_ops}, {"ldmatrix_conflicts", s.ldmatrix_conflicts},
      {"mma_ops", s.mma_ops}, {"shfl_ops", s.shfl_ops}, {"cp_async_ops", s.cp_async_ops},
      {"bad_addresses", s.bad_addresses}, {"deadlocks", s.deadlocks}, {"lazy_copies", s.lazy_copies},
  };
  for (const auto& row : table)
    if (std::strcmp(row.name, name) == 0) return row.value;
  return -1;
}

extern "C" __attribute__((weak)) int tilefuse_emu_set(const char* name, long long value) {
  tf_emu::State& s = tf_emu::state();
  if (std::strcmp(name, "lazy_copies") == 0) {
    s.lazy_copies = value;
    return 0;
  }
  if (std::strcmp(name, "reset") == 0) {
    s.launches = s.ldmatrix_ops = s.ldmatrix_conflicts = s.mma_ops = s.shfl_ops = 0;
    s.cp_async_ops = s.bad_addresses = s.deadlocks = 0;
    s.last_error = cudaSuccess;
    return 0;
  }
  return -1;
}

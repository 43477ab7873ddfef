// tilefuse: rung=9 arch=sm_90a portable=no reason="TMA multicast, clusters, mbarrier, wgmma and setmaxnreg are NVIDIA Hopper-only" claims=HGMMA
//
// Rung 9: a persistent, cluster-multicast, TMA-store GEMM. Rung 8's warp-specialised 128x256 core, plus:
//
//   * Persistent grid: one CTA per SM (as many 2-CTA clusters as can be resident at once), each looping over
//     output tiles. The pipeline never drains between tiles: while the consumers run one tile's epilogue the
//     producer is already loading the next tile's first stages, and no CTA pays launch and prologue again.
//   * L2-aware tile order: tiles are walked in groups of GROUP_M cluster-rows (column-major inside a group),
//     so the ~66 tiles in flight at once share 8 row-panels of A and ~8 column-panels of B, which stay in L2.
//   * TMA multicast across a cluster of 2: the two CTAs of a cluster compute vertically adjacent 128x256 tiles
//     that need the same 256x64 slice of B. Each CTA loads one half of it and multicasts it into both CTAs'
//     shared memory, so B costs each CTA 16 KB of L2 traffic a k-tile instead of 32 (48 -> 32 KB a k-tile:
//     L2->SM traffic drops by a third). A stage is only refilled once the consumers of BOTH CTAs released it,
//     so the "empty" mbarriers count 2 x 8 consumer warps and consumers arrive on their peer's barrier too
//     (mapa + mbarrier.arrive.shared::cluster). Cluster barriers fence start (barrier init) and exit.
//   * TMA-store epilogue: accumulators (+ bias, GeLU) are rounded to 16 bits and written into 128B-swizzled
//     shared-memory chunks (64x64, bank-conflict free), two at a time (one in each of a consumer's two staging
//     buffers), then one fence.proxy.async and one thread stores the pair with cp.async.bulk.tensor, a 64-row box a
//     chunk: full 128-byte rows reach global memory instead of rung 8's 4-byte scatter. Pairs halve the fences and
//     barriers of a chunk at a time (docs/decisions/008-rung9-epilogue-in-pairs.md).
//   * A lean consumer k-loop (checked in the SASS by tests/test_cuda_hopper.py): the wgmma descriptors live in
//     uniform registers (stage 0's, stepped by whole tiles), and a stage is released by one predicated arrive a
//     lane (lane r to CTA r): 51 instructions a k-tile a warp, 4 of them HGMMA
//     (docs/decisions/004-rung9-consumer-k-loop.md).
//   * Work items handed over (cooperative consumers): the producer, which walks the cluster's tiles one stage ahead
//     anyway, writes each item's record (corner, tile, k-tiles) into a small shared-memory array before it arrives on
//     the full barrier of the item's first stage; the consumers read it there instead of rebuilding the walk with a
//     chain of 32-bit divisions after every epilogue (put_item): 0.38 us from a tile's epilogue to the next
//     mainloop instead of 0.9 (docs/decisions/007-rung9-work-item-handover.md).
//   * The epilogue kind (none / bias / GeLU) is a template argument, a kernel each: chosen at run time it put a
//     branch, a bias load and a GeLU around every accumulator pair, and the consumers stalled on instruction fetch
//     in every tile's epilogue (tensor pipe active 76 % of the time against cuBLAS's 95 %; 94 % since:
//     docs/decisions/003-epilogue-as-template-argument.md).
//   * A last round that would leave clusters idle is split by k-tiles (stream-K) or evened out with narrow tiles
//     (balanced rounds): see the switches below.
//
// Measured (H200, bf16, the ladder suite, through tilefuse.cuda.gemm, interleaved with cuBLAS;
//   docs/decisions/001-ladder-rung-by-rung.md): 4096^3 715 TFLOP/s (1.024x cublas_nt, the K-major-B cuBLAS call),
//   8192^3 703 TFLOP/s (1.020x), 16384x4096x4096 684 TFLOP/s (1.012x). In interleaved A/Bs 1.007-1.011x cublas_nt
//   at 4096^3 and 1.033-1.062x at 8192^3 (docs/decisions/010-ladder-bar.md). The mainloop takes 1025-1043 SM
//   cycles a k-tile against 1024 at the tensor cores' peak; the rest is the epilogue, the start and the last round.
//
// Layouts: A is [M,K] row-major (lda >= K), B is given as [N,K] row-major (K-major B: tilefuse_rung9_b_layout()
// returns 1; ldb >= K), C is [M,N] row-major (ldc >= N). bf16 (dtype 0) or fp16 (dtype 1) in and out, fp32
// accumulation. epilogue 0: C = A*B^T; 1: + bias[N]; 2: gelu(erf form)(x + bias[N]); bias has C's dtype.
// Requirements (TMA): A, B and C 16-byte aligned, lda, ldb and ldc multiples of 8 elements (16-byte row
// strides), so K multiple of 8, and N a multiple of 8 even with a wider ldc (TMA's stores clip C's last columns to
// whole 16-byte units only); K >= 8; M any. Anything else returns cudaErrorInvalidValue before a launch.
//
// Run-time switches (none of them part of the ladder ABI; tools/ladder_sweep.py times each setting on the GPU):
//
// Debug: tilefuse_rung9_set_debug(flags) switches single features off, to find which one a wrong result comes
// from: 1 = no multicast (each CTA loads its whole B tile itself), 2 = not persistent (one tile a cluster),
// 4 = direct register stores instead of the TMA-store epilogue.
//
// Schedule: tilefuse_rung9_set_schedule(clusters, group_m, order, cluster_size) (0 = the default for each) picks
// how many clusters the persistent grid has (default: as many as cudaOccupancyMaxActiveClusters says can be
// resident), the group depth of the L2-aware order (default GROUP_M), the order (0: groups of cluster-rows walked
// column-major, the default; 1: the transpose, groups of tile-columns walked row-major) and the cluster size (2,
// the default, with B multicast; or 1, no cluster: each CTA loads its whole B tile). Clusters of 4 are not offered:
// only 30 are resident, a lost round at every shape (docs/decisions/008-rung9-epilogue-in-pairs.md).
// tilefuse_rung9_occupancy reports the resident-cluster count.
//
// Ping-pong: tilefuse_rung9_set_pingpong(1) (default 0, cooperative) gives each consumer warpgroup a whole 64x256
// tile of its own: the CTA's tiles alternate between the consumers, whose mainloops take turns (an mbarrier
// hand-over after a tile's last stage), so one's epilogue runs under the other's mainloop. A 64-row tile reads a
// 40 KB stage for half the math of a 48 KB one (L2->SM 47 instead of 31 B/clk/SM); 5 stages, one C staging chunk a
// consumer, always the TMA-store epilogue (a direct-store copy spilled). 6-7 % slower than cooperative at 4096^3
// (docs/decisions/004-rung9-consumer-k-loop.md).
//
// Stream-K: tilefuse_rung9_set_streamk(0 or 1; 1, the default). C clusters run `tiles` cluster-tiles in
// ceil(tiles / C) rounds; at 8192^3 (1024 cluster-tiles on 66 clusters) the 16th round has 34 of 66 busy. The tiles
// of the last, partial round are cut by k-tiles into C equal ranges, one a cluster, laid end to end (tile-major,
// k-minor): a range starts in the middle of a tile (its first piece: the tile's later k-tiles) and ends in the middle
// of another. A piece without its tile's first k-tile writes its fp32 accumulators to a workspace slot (each thread
// 128 values as 32 coalesced float4) and sets its flag (release, gpu scope); the piece with the first k-tile, which
// its cluster runs last, waits for the other pieces' flags (acquire), adds their sums and runs the epilogue. A
// cluster writes at most one partial, so the workspace is one 64 KB slot a consumer warpgroup of each CTA. Flags
// hold the launch's epoch (a per-device counter), so no launch clears them. The split costs ~10 us, so the host
// splits only where the last round gets shorter by more than 16 k-tiles (streamk_split: 8192^3 and 16384x4096x4096,
// 2.3 % faster; not 4096^3, whose last round has 58 of 66 clusters busy), every cluster is resident (a head waits
// on later clusters), and never in ping-pong, with the GeLU epilogue (its fix-up spilled), with debug flag 2, or
// under CUDA-graph capture (a replay would reuse the epoch); a launch on another stream first waits for the last
// one that used the device's workspace (docs/decisions/005-rung9-stream-k.md).
//
// Balanced rounds: tilefuse_rung9_set_balance(0 or 1; 1, the default). Where stream-K does not split, a last round
// with idle clusters is evened out with narrow tiles: 16 tiles of 240 columns (m64n240k16, 15/16 of a whole tile's
// tensor-core time) span the columns of 15 whole ones, so a "narrow" cluster-row has one tile more. The last y
// cluster-rows are narrow, walked after every whole tile; the host picks the y that leaves the busiest cluster the
// least work (balance_rows; at 4096^3 4 rows: the busiest cluster has 63/64 of four whole tiles' work, 0.8-1.3 %
// faster). The producer loads the whole 256-row B tile (wgmma reads 240 rows) and records the width in the work
// item; the consumers run an m64n240k16 copy of the k-loop, and a narrow tile's last 48-column chunk is stored with
// 16-byte stores (a 64-column TMA box would write the next tile's columns). Never in ping-pong, with stream-K, in
// the transposed order or without a persistent grid (docs/decisions/009-rung9-balanced-last-round.md).
//
// Stores: tilefuse_rung9_set_stores(1) (default 0): warp stores. Each warp waits for its own earlier stores,
// writes its 16 rows and its lane 0 stores them (a 16-row box; the host encodes C's tensor map for the mode), so
// the epilogue has no warpgroup barrier; the default meets the warpgroup at a named barrier before and after each
// pair of chunks (4 a tile). Off by default: it gained less than the pairs
// (docs/decisions/008-rung9-epilogue-in-pairs.md).
//
// L2 policies: tilefuse_rung9_set_l2(a, b, c): the L2 eviction priority of A's TMA loads, B's and C's TMA stores
// (0 evict-normal, 1 evict-first, 2 evict-last). Every TMA access carries its policy (a createpolicy.fractional
// value in uniform registers; the .L2::cache_hint form), so each access has one instruction form: a plain and a
// hinted copy chosen by a branch made the kernel 36 % longer in SASS and 1.1 % slower. Default: evict-first on C
// (written once, never read here), the one policy that never lost; none moved 4096^3 beyond the ~1 % between
// interleaved runs (docs/decisions/006-rung9-l2-policies.md).
#include <mutex>

#include "hopper.cuh"  // the TMA / mbarrier / wgmma helpers rungs 7-9 share

namespace {

// ---------------------------------------------------------------------------------------------------------
// Tile shape and shared-memory plan.
constexpr int BM = 128;            // rows of C a CTA computes: two consumer warpgroups x 64 rows
constexpr int BN = 256;            // m64n256k16: 128 fp32 accumulators a consumer thread
constexpr int BK = 64;             // 64 bf16 = 128 bytes = exactly one 128B swizzle row
constexpr int STAGES = 4;          // 4 x 48 KB + 32 KB of C staging = 224 KB of the 227 KB a block may have
constexpr int CLUSTER = 2;         // CTAs a cluster (the default; 1 at run time: see Schedule); they share B
constexpr int CONSUMERS = 2;
constexpr int THREADS = 128 * (1 + CONSUMERS);
constexpr int CONSUMER_WARPS = CONSUMERS * 4;
constexpr int PRODUCER_REGS = 48;  // the producer loop with balanced tiles (tile_span) spilled at 40
constexpr int CONSUMER_REGS = 224;  // 232 before balanced tiles; no spills at 224 either
// setmaxnreg only moves registers inside the CTA's launch allocation, THREADS x the registers ptxas gives each thread
// (__launch_bounds__(THREADS, 1): 65536 / 384 rounded down to a multiple of 8, 168). Asking for more leaves the
// consumers' setmaxnreg.inc waiting for registers that never come (48 + 2 x 232 hung every launch:
// docs/decisions/009-rung9-balanced-last-round.md).
constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;
static_assert(LAUNCH_REGS == 168, "the per-thread registers at launch (test_setmaxnreg_took_effect checks the build)");
static_assert(128 * PRODUCER_REGS + 128 * CONSUMERS * CONSUMER_REGS <= THREADS * LAUNCH_REGS,
              "setmaxnreg redistributes the CTA's launch allocation, no more");
constexpr int GROUP_M = 8;         // cluster-rows of tiles walked together (L2 reuse; see the header)
constexpr int A_TILE_BYTES = BM * BK * 2;                 // 16 KB
constexpr int B_TILE_BYTES = BN * BK * 2;                 // 32 KB
constexpr int B_PART_ROWS = BN / CLUSTER;                 // each CTA loads 128 rows of the B tile
constexpr int B_PART_BYTES = B_PART_ROWS * BK * 2;        // 16 KB
constexpr int STAGE_BYTES = A_TILE_BYTES + B_TILE_BYTES;  // the expect_tx count of one stage (own A, both B parts)
constexpr int CONSUMER_A_BYTES = 64 * BK * 2;             // consumer c reads rows 64c..64c+63 of the A tile
constexpr int C_CHUNK_COLS = 64;                          // 64 x 16 bits = one 128-byte swizzle row
constexpr int C_CHUNK_ROWS = 64;                          // one consumer's rows
constexpr int C_CHUNK_BYTES = C_CHUNK_ROWS * C_CHUNK_COLS * 2;  // 8 KB
// The C tensor map's box: a whole 64x64 chunk (one store a chunk), or with warp stores one warp's 16 rows of it.
constexpr int C_STORE_ROWS = 16;
constexpr int C_STORE_BYTES = C_STORE_ROWS * C_CHUNK_COLS * 2;  // 2 KB, two 1 KB swizzle atoms
constexpr int C_BUFFERS = 2;                              // per consumer: a pair of chunks (see the epilogue)
constexpr int SWIZZLE_ATOM_BYTES = 1024;                  // 8 rows x 128 B: the 128B swizzle repeats every 1 KB
// Ping-pong (tilefuse_rung9_set_pingpong(1), see the header): each consumer warpgroup owns a whole 64x256 tile,
// so a stage holds 64 rows of A (8 KB) + the 256x64 B tile: 40 KB, 5 of them in the space of the default's 4,
// and one staging chunk a consumer (its epilogue runs under the other consumer's mainloop, so it may wait).
constexpr int PP_BM = 64;
constexpr int PP_STAGES = 5;
constexpr int PP_A_TILE_BYTES = PP_BM * BK * 2;                 // 8 KB
constexpr int PP_STAGE_BYTES = PP_A_TILE_BYTES + B_TILE_BYTES;  // 40 KB
constexpr int PP_C_BUFFERS = 1;
constexpr int MAX_STAGES = PP_STAGES > STAGES ? PP_STAGES : STAGES;
// Stages + staging of either layout; the barriers follow at a fixed offset: full[MAX_STAGES], empty[MAX_STAGES],
// turn[CONSUMERS] (ping-pong's mainloop hand-over).
constexpr int RING_BYTES = STAGES * STAGE_BYTES + CONSUMERS * C_BUFFERS * C_CHUNK_BYTES;  // 224 KB
// Then, after the barriers, ITEM_SLOTS work-item records (ITEM_BYTES each, see put_item).
constexpr int ITEM_BYTES = 32;
constexpr int ITEM_SLOTS = 8;
static_assert(ITEM_SLOTS > STAGES, "a record outlives its item's epilogue (see put_item)");
constexpr int SMEM_BYTES =
    SWIZZLE_ATOM_BYTES /* alignment slack */ + RING_BYTES + (2 * MAX_STAGES + CONSUMERS) * 8 + ITEM_SLOTS * ITEM_BYTES;
static_assert(PP_STAGES * PP_STAGE_BYTES + CONSUMERS * PP_C_BUFFERS * C_CHUNK_BYTES <= RING_BYTES,
              "the ping-pong layout fits in the default's stages + staging");
static_assert(A_TILE_BYTES % SWIZZLE_ATOM_BYTES == 0 && B_PART_BYTES % SWIZZLE_ATOM_BYTES == 0 &&
                  C_CHUNK_BYTES % SWIZZLE_ATOM_BYTES == 0 && PP_A_TILE_BYTES % SWIZZLE_ATOM_BYTES == 0,
              "every tile must start on a 1 KB swizzle atom so TMA's and wgmma's swizzle phases agree");
static_assert(SMEM_BYTES <= 227 * 1024, "the per-block shared-memory limit of sm_90");

constexpr int DEBUG_NO_MULTICAST = 1;
constexpr int DEBUG_NOT_PERSISTENT = 2;
constexpr int DEBUG_DIRECT_STORE = 4;

// ---------------------------------------------------------------------------------------------------------
// Shared-memory addresses (the wgmma descriptors of hopper.cuh).
// The consumers step a stage-0 descriptor by whole tiles (desc + s * desc_field(tile bytes)): exact while every
// shared address (dynamic shared memory starts after sm_90's 1 KB reserved window) fits the 18-bit field.
constexpr uint32_t RESERVED_SMEM_BYTES = 1024;
static_assert(RESERVED_SMEM_BYTES + SMEM_BYTES <= 0x40000, "stage descriptors are stepped without a carry out of 18 bits");

// Byte offset of element (row, col) of a [rows][64] 16-bit chunk in the 128B swizzle, as TMA reads it back:
// the 16-byte unit (col / 8) of row r sits at unit (col / 8) ^ (r % 8).
__host__ __device__ constexpr uint32_t swizzle128_offset(uint32_t row, uint32_t col) {
    return row * 128 + ((((col / 8) ^ (row % 8)) & 7) << 4) + (col % 8) * 2;
}
static_assert(swizzle128_offset(0, 0) == 0 && swizzle128_offset(1, 0) == 128 + 16 && swizzle128_offset(7, 8) == 7 * 128 + 6 * 16 &&
                  swizzle128_offset(9, 63) == 9 * 128 + (7 ^ 1) * 16 + 14,
              "128B swizzle");

// L2-aware order: tile t -> (cluster-row, column). Groups of GROUP_M cluster-rows, column-major inside a
// group, so consecutive tiles (which run at the same time on different SMs) share rows of A and columns of B.
struct TileRC {
    int row, col;
};
__host__ __device__ constexpr TileRC grouped_tile(int t, int tiles_m, int tiles_n, int group_m) {
    const int per_group = group_m * tiles_n;
    const int group = t / per_group;
    const int first = group * group_m;
    const int rows = (tiles_m - first) < group_m ? (tiles_m - first) : group_m;  // the last group may be short
    const int r = t - group * per_group;
    return TileRC{first + r % rows, r / rows};
}
__host__ __device__ constexpr TileRC grouped_tile(int t, int tiles_m, int tiles_n) {
    return grouped_tile(t, tiles_m, tiles_n, GROUP_M);
}
// The run-time choice (Schedule::order): 0 = grouped_tile; 1 = its transpose (groups of group_m tile-columns,
// row-major inside a group). group_m = 1 makes them plain row-major (0) and column-major (1) orders.
constexpr int ORDER_ROW_GROUPS = 0;
constexpr int ORDER_COLUMN_GROUPS = 1;
__host__ __device__ constexpr TileRC tile_at(int t, int tiles_m, int tiles_n, int group_m, int order) {
    return order == ORDER_COLUMN_GROUPS
               ? TileRC{grouped_tile(t, tiles_n, tiles_m, group_m).col, grouped_tile(t, tiles_n, tiles_m, group_m).row}
               : grouped_tile(t, tiles_m, tiles_n, group_m);
}
static_assert(grouped_tile(1, 16, 16).row == 1 && grouped_tile(8, 16, 16).row == 0 && grouped_tile(8, 16, 16).col == 1 &&
                  grouped_tile(128, 16, 16).row == 8 && grouped_tile(5, 3, 4).row == 2 && grouped_tile(5, 3, 4).col == 1,
              "grouped tile order");
static_assert(tile_at(1, 16, 16, 8, ORDER_COLUMN_GROUPS).col == 1 && tile_at(1, 16, 16, 8, ORDER_COLUMN_GROUPS).row == 0 &&
                  tile_at(8, 16, 16, 8, ORDER_COLUMN_GROUPS).row == 1 && tile_at(3, 16, 16, 1, ORDER_ROW_GROUPS).col == 3 &&
                  tile_at(3, 16, 16, 1, ORDER_COLUMN_GROUPS).row == 3,
              "transposed tile order");

// Balanced rounds (see the header): a "narrow" cluster-row has NARROW_TILES tiles of NARROW_BN columns, as wide
// together as NARROW_TILES - 1 whole ones, so it has one tile more than a whole row; its whole tiles come first.
constexpr int NARROW_BN = 240;   // m64n240k16: 15/16 of a tile's tensor-core time
constexpr int NARROW_TILES = 16;
static_assert(NARROW_TILES * NARROW_BN == (NARROW_TILES - 1) * BN, "a narrow row spans the columns of a whole one");
constexpr int NARROW_CHUNK = NARROW_BN / C_CHUNK_COLS;  // a narrow tile's short C chunk, its last (3)
constexpr int NARROW_CHUNK_COLS = NARROW_BN - NARROW_CHUNK * C_CHUNK_COLS;  // 48 columns, stored directly
static_assert(NARROW_CHUNK == BN / C_CHUNK_COLS - 1, "the short chunk is a narrow tile's last (the epilogue's pairs)");
// Tile t of the walk: its cluster-row, first column and width. With narrow_rows = y > 0 (the default order only)
// the first tiles_m - y cluster-rows are walked as tile_at walks them, then the last y rows, column-major as one
// group: first their whole tiles (columns 0 .. tiles_n - NARROW_TILES), then their narrow ones.
struct TileSpan {
    int row, n0;
    bool narrow;
};
__host__ __device__ constexpr TileSpan tile_span(int t, int tiles_m, int tiles_n, int group_m, int order,
                                                 int narrow_rows) {
    const int whole_tiles = (tiles_m - narrow_rows) * tiles_n;
    if (narrow_rows == 0 || t < whole_tiles) {
        const TileRC rc = tile_at(t, tiles_m - narrow_rows, tiles_n, group_m, order);
        return TileSpan{rc.row, rc.col * BN, false};
    }
    const int r = t - whole_tiles, col = r / narrow_rows;
    const int whole_cols = tiles_n - (NARROW_TILES - 1);  // whole tiles a narrow row keeps
    const bool narrow = col >= whole_cols;
    return TileSpan{tiles_m - narrow_rows + r % narrow_rows,
                    narrow ? whole_cols * BN + (col - whole_cols) * NARROW_BN : col * BN, narrow};
}
static_assert(tile_span(5, 16, 16, 8, 0, 0).n0 == tile_at(5, 16, 16, 8, 0).col * BN &&
                  tile_span(12 * 16, 16, 16, 8, 0, 4).row == 12 && tile_span(12 * 16 + 3, 16, 16, 8, 0, 4).row == 15 &&
                  tile_span(12 * 16 + 1, 16, 16, 8, 0, 4).n0 == 0 && !tile_span(12 * 16 + 1, 16, 16, 8, 0, 4).narrow &&
                  tile_span(12 * 16 + 4, 16, 16, 8, 0, 4).narrow && tile_span(12 * 16 + 4, 16, 16, 8, 0, 4).n0 == BN &&
                  tile_span(12 * 16 + 8, 16, 16, 8, 0, 4).n0 == BN + NARROW_BN &&
                  tile_span(12 * 16 + 4 * 17 - 1, 16, 16, 8, 0, 4).n0 == 4096 - NARROW_BN,
              "balanced tile spans: 4096^3 with 4 narrow rows");

// What the host picks at run time (tilefuse_rung9_set_schedule), passed to the kernel by value.
struct Schedule {
    int cluster;  // CTAs a cluster: 2 (B multicast) or 1
    int group_m;  // group depth of the tile order
    int order;    // ORDER_ROW_GROUPS or ORDER_COLUMN_GROUPS
    int pingpong; // 0: both consumers on one 128x256 tile (cooperative); 1: each on its own 64x256 tile
    int warp_stores;  // 1: each warp stores its own rows of a C chunk (no warpgroup barrier; see the header)
    int streamk;      // 1: the last, partial round's tiles are split by k-tiles over the clusters (see the header)
    int l2;           // L2 policies (see the header, "L2 policies"): A's loads, B's loads, C's stores, 2 bits each
    int narrow_rows;  // balanced rounds (see the header): the last cluster-rows that have NARROW_TILES narrow tiles
};
// tilefuse_rung9_set_l2's policies, 2 bits a stream of Schedule::l2 (A at bit 0, B at bit 2, C at bit 4).
constexpr int L2_EVICT_NORMAL = 0, L2_EVICT_FIRST = 1, L2_EVICT_LAST = 2;
constexpr int L2_A_SHIFT = 0, L2_B_SHIFT = 2, L2_C_SHIFT = 4;

// Stream-K's global memory (see the header): CONSUMERS x 128 threads x 128 floats a CTA, and a flag each.
struct StreamK {
    float* workspace;  // [slot][32 float4][128 threads] of float4; slot = (cluster * csize + rank) * CONSUMERS + consumer
    int* flags;        // [slot]: the epoch of the launch that last wrote the slot
    int epoch;         // this launch's, > 0
    int dp_end;        // the first split tile: tiles / clusters * clusters
    int units;         // k-tiles of the split tiles, (tiles - dp_end) * k_tiles; units * clusters < 2^31 (the host checks)
};
constexpr int SK_SLOT_FLOATS = 128 * 128;  // one consumer warpgroup's accumulators
constexpr int PIECE_LATER = 1;       // a work item without its tile's first k-tile: it leaves a partial sum
constexpr int PIECE_UNFINISHED = 2;  // a work item without its tile's last k-tile: it adds the later ones' sums
constexpr int PIECE_NARROW = 4;      // a narrow tile of a balanced schedule (NARROW_BN columns; never split)
// Stream-K pays off when the last round gets shorter by more than what the split costs: measured (interleaved
// against the unsplit kernel, docs/decisions/005-rung9-stream-k.md) ~10 us, 13-14 k-tiles of a 128x256 tile at 4096^3
// and 8192^3, where the partial sums' writes and reads alone were estimated at 2-3 us. See streamk_split.
#ifndef TILEFUSE_RUNG9_SK_FIXUP_K_TILES
constexpr int SK_FIXUP_K_TILES = 16;
#else  // a diagnostic build (tools/rung9_trace.py) may split where the library does not
constexpr int SK_FIXUP_K_TILES = TILEFUSE_RUNG9_SK_FIXUP_K_TILES;
#endif

// Timeline trace, compiled only into diagnostic builds (-D TILEFUSE_RUNG9_TRACE=1, tools/rung9_trace.py): thread 0
// of each consumer warpgroup stamps %globaltimer at its entry and, for each of its work items, at the start of the
// mainloop, its end, the end of the stream-K step (partial written, or the other pieces' sums added) and the end of
// the epilogue's stores being issued, with the item's tile, k-tiles and piece bits, and the SM's %clock at the
// mainloop's start and end (so a phase's clock rate shows, not only its time). The library's builds have none
// of it. Layout: a slot per consumer warpgroup ((cluster * csize + rank) * CONSUMERS + consumer), each TRACE_WORDS
// 64-bit words: [entry time, items], then TRACE_ITEM_WORDS a work item.
#ifndef TILEFUSE_RUNG9_TRACE
#define TILEFUSE_RUNG9_TRACE 0
#endif
#if TILEFUSE_RUNG9_TRACE
// Item words: 0-3 the times above, 4 the tile, 5 k-tiles | piece << 16 | kb << 32, 6-7 %clock at the mainloop's start
// and end, 8 + 5 jc + p %clock in C chunk jc of the TMA-store epilogue at: p = 0 its start, 1 past the wait for its
// buffer, 2 its values written, 3 past the proxy fence, 4 past the barrier before its stores (3 and 4 only in the
// last chunk of a group: 0 in the others); 28 the epilogue's end.
constexpr int TRACE_EPI_WORDS = 8, TRACE_EPI_END = TRACE_EPI_WORDS + 5 * 4;
constexpr int TRACE_MAX_ITEMS = 40, TRACE_ITEM_WORDS = TRACE_EPI_END + 2;
constexpr int TRACE_WORDS = 2 + TRACE_MAX_ITEMS * TRACE_ITEM_WORDS;
__device__ unsigned long long* g_trace = nullptr;  // set by tilefuse_rung9_set_trace
#endif

// ---------------------------------------------------------------------------------------------------------
// PTX wrappers rung 9 alone uses (the shared ones are in hopper.cuh).
#if TILEFUSE_RUNG9_TRACE
// The SM's cycle counter, 32 bits (one register: %clock64 made the traced plain kernel spill); a mainloop is far
// shorter than 2^32 cycles, so the reader takes the difference modulo 2^32.
__device__ __forceinline__ unsigned long long sm_clock() {
    uint32_t t;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(t));
    return t;
}
#endif

#if TILEFUSE_RUNG9_TRACE
// Word w of work item j (w < 0: the slot's header word -w - 1) of slot `slot`, when a trace buffer is set.
__device__ __forceinline__ void trace_put(int slot, int j, int w, unsigned long long v) {
    if (g_trace == nullptr || j >= TRACE_MAX_ITEMS) return;
    unsigned long long* base = g_trace + (size_t)slot * TRACE_WORDS;
    if (w < 0) base[-w - 1] = v;
    else base[2 + j * TRACE_ITEM_WORDS + w] = v;
}
#define RUNG9_TRACE(slot, j, w, v) \
    do { if (tid == 0) trace_put((slot), (j), (w), (v)); } while (0)
#define RUNG9_EPI_STAMP(jc, p) RUNG9_TRACE(trace_slot, j, TRACE_EPI_WORDS + 5 * (jc) + (p), sm_clock())
#else
#define RUNG9_TRACE(slot, j, w, v) do { } while (0)
#define RUNG9_EPI_STAMP(jc, p) do { } while (0)
#endif

// hopper.cuh's TMA load, carrying the L2 policy `policy` (from l2_policy).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar,
                                            uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%3, %4}], [%2], %5;"
        ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "l"(policy)
        : "memory");
}

// An L2 cache policy for a whole access (fraction 1.0): L2_EVICT_FIRST, L2_EVICT_LAST, or evict-normal for
// anything else. The three policies are made and one is selected, with no branch (not volatile: they depend on
// nothing, so ptxas may make them once).
__device__ __forceinline__ uint64_t l2_policy(int kind) {
    uint64_t first, last, normal;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(first));
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(last));
    asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(normal));
    return kind == L2_EVICT_FIRST ? first : kind == L2_EVICT_LAST ? last : normal;
}

// ---------------------------------------------------------------------------------------------------------
// Cluster, multicast and TMA-store wrappers.
__device__ __forceinline__ uint32_t cluster_ctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t cluster_index() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t cluster_count() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
    return r;
}
// Every thread of both CTAs: release what this thread did before, acquire what the others did.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
// The address of the same shared-memory offset in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t map_to_rank(uint32_t addr, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
// Arrive on a barrier of any CTA of the cluster. Default semantics (release at CTA scope), as a stage release
// needs: what must be ordered is that this warp's wgmma reads of the stage completed (wgmma.wait_group did
// that) before a producer's TMA overwrites it. ".release.cluster" would cost a MEMBAR.GPU before every arrive.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t cluster_addr) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_addr) : "memory");
}
// Release a stage to the producers of every CTA of the cluster: lane r (< csize: a releaser) of the warp
// arrives on CTA r's barrier, so a warp still counts one arrival on each CTA's barrier. One predicated arrive
// a lane instead of a loop over ranks on lane 0, which ptxas unrolled 16-fold behind a divergent branch
// (31 arrive instructions in each k-loop's SASS, ~30 issued a k-tile for a cluster of 2). `target` is the
// lane's CTA's stage-0 empty barrier in the cluster window (mapa once, before the loop: a stage's barrier is
// `stage` x 8 bytes further, the window maps a CTA's shared memory as one block). With the lane mapped inside
// the loop ptxas re-read SR_TID (S2R) every k-tile of a loop that released the stage just read (a variant tried
// and removed: docs/decisions/004-rung9-consumer-k-loop.md). Lanes that release nothing hold target 0 (no
// barrier of the window is at 0): the predicate comes from a register the loop holds anyway, where a separate
// `lane < csize` made ptxas either rebuild it from SR_TID every k-tile or spill it (with stream-K's registers).
__device__ __forceinline__ void release_stage(uint32_t target, uint32_t stage) {
    if (target != 0) mbar_arrive_cluster(target + 8 * stage);
}
// A value the whole warp holds, as the compiler can see (a broadcast from lane 0): what is computed from it may
// live in uniform registers, as wgmma's descriptors must.
__device__ __forceinline__ int warp_uniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }
// TMA load of one box into the same offset of every CTA in cta_mask, each signalling the mbarrier at the
// same offset in its own shared memory.
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                                      uint32_t bar, uint16_t cta_mask, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster.L2::cache_hint"
        " [%0], [%1, {%3, %4}], [%2], %5, %6;"
        ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "h"(cta_mask), "l"(policy)
        : "memory");
}
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1, uint64_t policy) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3}], [%1], %4;"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(src), "r"(c0), "r"(c1), "l"(policy)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// At most N store groups may still be reading their shared-memory source.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
// At most N store groups may still be in flight at all (their global writes included).
template <int N>
__device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}
// Ordinary shared-memory stores must be made visible to the copy engine (the async proxy) before it reads.
__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
// The work-item hand-over (cooperative consumers): the producer, which walks the cluster's work items anyway, writes
// item j's record into slot j % ITEM_SLOTS before it arrives on the full barrier of the item's first k-tile's stage
// (an arrive releases what the thread wrote before it at CTA scope, a completed wait acquires it), and after the last
// item a record with no k-tiles, on a stage it completes with a plain arrive. The consumers read the record once they
// waited for that stage, and again after the mainloop (so that nothing of it is held in registers across the
// k-loop), instead of rebuilding the walk and dividing their way to the next tile after every epilogue (that took
// 0.9 us between a tile's epilogue and the next mainloop, 2 % of a tile at 4096^3: 0.38 us now,
// docs/decisions/007-rung9-work-item-handover.md). The producer rewrites slot j only
// for item j + ITEM_SLOTS, whose first stage it gets back once the consumers released the k-tile `STAGES` before
// it: since every item has a k-tile, that is a k-tile after item j, released only after item j's epilogue.
// Record: {m0 of the CTA's tile, n0, t, k-tiles | piece << ITEM_PIECE_SHIFT}, then kb (for the trace builds).
constexpr int ITEM_PIECE_SHIFT = 28;  // k-tiles < 2^25 (K < 2^31): the piece bits above them
struct Item {
    int m0, n0, t, left_piece;
};
__device__ __forceinline__ void put_item(uint32_t addr, int m0, int n0, int t, int left_piece, int kb) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\nst.shared.b32 [%0+16], %5;"
                 ::"r"(addr), "r"(m0), "r"(n0), "r"(t), "r"(left_piece), "r"(kb) : "memory");
}
// Whether the record's item is a narrow tile (PIECE_NARROW), read where the epilogue needs it: a flag held across
// the epilogue made the stream-K kernels spill.
__device__ __forceinline__ bool item_narrow(uint32_t addr) {
    uint32_t left_piece;
    asm volatile("ld.shared.b32 %0, [%1+12];" : "=r"(left_piece) : "r"(addr) : "memory");
    return ((left_piece >> ITEM_PIECE_SHIFT) & PIECE_NARROW) != 0;
}
__device__ __forceinline__ Item get_item(uint32_t addr) {
    Item it;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(it.m0), "=r"(it.n0), "=r"(it.t), "=r"(it.left_piece) : "r"(addr) : "memory");
    return it;
}
// Stream-K's flags: set after a partial sum is written, read before it is added (see the header).
__device__ __forceinline__ void flag_release(int* flag, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(flag), "r"(v) : "memory");
}
__device__ __forceinline__ int flag_acquire(const int* flag) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    return v;
}

// The first 112 operands of a wgmma's D list (m64n240k16 has 120; TF_ACC_* and m64n256k16 are in hopper.cuh).
#define TF_D_0_111 \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "

// D(64x240, fp32) (+)= A(64x16) * B(16x240 given as 240x16): the narrow tiles of a balanced last round (see the
// header, "Balanced rounds"). D is d[0..119], the first 120 accumulators of the m64n256k16 layout (30 n8 blocks).
#define TF_ACC_120(d) TF_ACC_64(d, 0), TF_ACC_8(d, 64), TF_ACC_8(d, 72), TF_ACC_8(d, 80), TF_ACC_8(d, 88), \
                      TF_ACC_8(d, 96), TF_ACC_8(d, 104), TF_ACC_8(d, 112)
#define TF_WGMMA_M64N240K16(DTS, d, desc_a, desc_b, scale_d) \
    asm volatile( \
        "{\n.reg .pred p;\n" \
        "setp.ne.b32 p, %122, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n240k16.f32." DTS "." DTS " {" \
        TF_D_0_111 \
        "%112, %113, %114, %115, %116, %117, %118, %119" \
        "}, %120, %121, p, 1, 1, 0, 0;\n}\n" \
        : TF_ACC_120(d) \
        : "l"(desc_a), "l"(desc_b), "r"(scale_d) \
        : "memory")


template <int DT>
__device__ __forceinline__ void wgmma_m64n240k16(float (&d)[120], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
    if constexpr (DT == 0) {
        TF_WGMMA_M64N240K16("bf16", d, desc_a, desc_b, scale_d);
    } else {
        TF_WGMMA_M64N240K16("f16", d, desc_a, desc_b, scale_d);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Epilogue pieces of rung 9 alone (store_fragment and the scalar helpers are in hopper.cuh).
// A narrow tile's last C chunk (columns 0..47 of a staging chunk, see tile_span), rows 16 warp .. 16 warp + 15, from
// staging to C (row0, col0) with 16-byte stores, 3 a lane (N is a multiple of 8: a unit is in C or past its end).
__device__ __forceinline__ void store_narrow_rows(uint32_t buf, void* C, int M, int N, long long ldc, int row0, int col0) {
    constexpr int units = NARROW_CHUNK_COLS / 8;  // 16-byte units a row
    // The thread index read here (volatile): from threadIdx, ptxas computed this copy's addresses at the kernel's
    // start and spilled them across everything.
    uint32_t tid;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
    const int lane = (int)(tid % 32), warp = (int)(tid / 32) % 4;
#pragma unroll
    for (int i = 0; i < 16 * units / 32; ++i) {
        const int id = lane + 32 * i, r = 16 * warp + id / units, col = col0 + 8 * (id % units);
        if (row0 + r >= M || col >= N) continue;
        uint32_t v[4];
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(buf + swizzle128_offset(r, col - col0)) : "memory");
        // C and ldc keep the 16-byte alignment
        *reinterpret_cast<uint4*>(reinterpret_cast<uint16_t*>(C) + (long long)(row0 + r) * ldc + col) =
            make_uint4(v[0], v[1], v[2], v[3]);
    }
}
static_assert(NARROW_CHUNK_COLS % 8 == 0 && 16 * (NARROW_CHUNK_COLS / 8) % 32 == 0, "whole 16-byte units, 3 a lane");

// ---------------------------------------------------------------------------------------------------------
// Shared memory: stages x [rows][128 B] of A, stages x [256 rows][128 B] of B (part 0, part 1), CONSUMERS x
// C buffers x [64 rows][128 B] of C staging, all 128B-swizzled; then the barriers at a fixed offset:
// full[MAX_STAGES] (bytes landed), empty[MAX_STAGES] (the stage's consumer warps of both CTAs are done),
// turn[CONSUMERS] (ping-pong: your mainloop may start).
__device__ __forceinline__ uint32_t smem_base(const void* smem_raw) {
    return (smem_u32(smem_raw) + SWIZZLE_ATOM_BYTES - 1) & ~uint32_t(SWIZZLE_ATOM_BYTES - 1);
}
constexpr uint32_t FULL_OFFSET = RING_BYTES;
constexpr uint32_t EMPTY_OFFSET = FULL_OFFSET + MAX_STAGES * 8;
constexpr uint32_t TURN_OFFSET = EMPTY_OFFSET + MAX_STAGES * 8;
constexpr uint32_t ITEM_OFFSET = TURN_OFFSET + CONSUMERS * 8;  // 16-byte aligned: RING_BYTES and 12 barriers
static_assert(ITEM_OFFSET % 16 == 0, "the work-item records are read as one 16-byte vector");

// Where a CTA's tiles are, for the producer and the consumers; each computes its own copy from the kernel's
// arguments (values carried from before the role branch into the consumers cost registers they don't have).
// Work item j of a cluster (work_item): its j-th whole tile while j < dp_count, then the pieces of its stream-K
// range [sk_lo, sk_hi) over the split tiles' k-tiles (tile-major: unit u is k-tile u % k_tiles of tile
// dp_end + u / k_tiles).
struct Walk {
    uint32_t rank;  // this CTA in its cluster
    int first_tile, tile_step, tiles, tiles_m, tiles_n, k_tiles, csize;
    int dp_end;    // tiles before it run whole (all of them without stream-K)
    int dp_count;  // whole tiles this cluster runs
    int sk_units, sk_lo, sk_hi;  // k-tiles of the split tiles, this cluster's range of them
    int narrow_rows;             // balanced rounds: see tile_span (0 with stream-K and in ping-pong)
};
// First unit of cluster c's stream-K range: C equal ranges, the first ones a unit shorter where units % C != 0.
// 32-bit: the host splits only where units * clusters < 2^31 (a 64-bit division here spilled).
__host__ __device__ __forceinline__ int sk_range_start(int units, int c, int clusters) { return units * c / clusters; }
// split: the host's plan (dp_end and units of StreamK) applies; otherwise every tile runs whole.
__host__ __device__ __forceinline__ Walk walk_for(int cluster, int clusters, uint32_t rank, int M, int N, int K, int rows,
                                                  int csize, bool split, int dp_end, int units, int narrow_rows) {
    Walk w;
    w.rank = rank;
    w.first_tile = cluster;
    w.tile_step = clusters;
    w.k_tiles = (K + BK - 1) / BK;
    w.csize = csize;                                      // 2, or 1 without a cluster
    w.tiles_m = (M + rows * csize - 1) / (rows * csize);  // cluster-rows of 256 (128 / 64 otherwise)
    w.tiles_n = (N + BN - 1) / BN;
    w.narrow_rows = split ? 0 : narrow_rows;
    w.tiles = w.tiles_m * w.tiles_n + w.narrow_rows;  // a narrow row has one tile more than a whole one
    w.dp_end = split ? dp_end : w.tiles;
    w.sk_units = split ? units : 0;
    w.sk_lo = sk_range_start(w.sk_units, cluster, clusters);
    w.sk_hi = sk_range_start(w.sk_units, cluster + 1, clusters);
    w.dp_count = cluster < w.dp_end ? (w.dp_end - cluster + clusters - 1) / clusters : 0;
    return w;
}
__device__ __forceinline__ Walk make_walk(int M, int N, int K, int rows, int csize, bool split, int dp_end, int units,
                                          int narrow_rows) {
    return walk_for((int)cluster_index(), (int)cluster_count(), cluster_ctarank(), M, N, K, rows, csize, split, dp_end,
                    units, narrow_rows);
}
// The cluster's j-th work item: tile t, k-tiles [kb, ke). false past the last one.
__host__ __device__ __forceinline__ bool work_item(const Walk& w, int j, int& t, int& kb, int& ke) {
    if (j < w.dp_count) {
        t = w.first_tile + j * w.tile_step;
        kb = 0;
        ke = w.k_tiles;
        return true;
    }
    const int p = j - w.dp_count;  // piece p of the stream-K range
    const int rel = w.sk_lo / w.k_tiles + p;
    const int u0 = p == 0 ? w.sk_lo : rel * w.k_tiles;
    if (u0 >= w.sk_hi) return false;
    const int end = (rel + 1) * w.k_tiles;
    t = w.dp_end + rel;
    kb = u0 - rel * w.k_tiles;
    ke = (end < w.sk_hi ? end : w.sk_hi) - rel * w.k_tiles;
    return true;
}
// Whether the head of split tile t (its piece with k-tile 0, the last piece of cluster cl's range) adds a second
// partial sum besides cluster cl + 1's: cluster cl + 2's range starts inside the tile too (a tile in 3 pieces).
// The kernel's fix-up and the host planner (tilefuse_rung9_streamk_plan) both ask this.
__host__ __device__ __forceinline__ bool sk_third_piece(int units, int dp_end, int k_tiles, int t, int cl,
                                                        int clusters) {
    return cl + 2 < clusters && sk_range_start(units, cl + 2, clusters) < (t - dp_end + 1) * k_tiles;
}
// The host's choice: split the last round when it leaves clusters idle, each tile in at most 3 pieces (a
// cluster's range is at least half a tile), and the round gets shorter by more than the fix-up's SK_FIXUP_K_TILES;
// and the units fit the kernel's 32-bit arithmetic.
__host__ __device__ constexpr bool streamk_split(long long tiles, long long clusters, long long k_tiles) {
    return clusters > 0 && tiles % clusters != 0 && tiles % clusters * k_tiles * clusters < 0x7fffffffLL &&
           2 * (tiles % clusters * k_tiles / clusters) >= k_tiles &&
           k_tiles - (tiles % clusters * k_tiles + clusters - 1) / clusters > SK_FIXUP_K_TILES;
}
// The split's extent, for StreamK (where streamk_split said yes): whole rounds first, the rest split.
__host__ __device__ inline StreamK streamk_extent(int tiles, int clusters, int k_tiles) {
    const int dp_end = tiles / clusters * clusters;
    return StreamK{nullptr, nullptr, 0, dp_end, (tiles - dp_end) * k_tiles};
}
// 8192^3 (1024 cluster-tiles of 128x256 x 2, 128 k-tiles, 66 clusters: the 16th round 34/66 busy) and
// 16384x4096x4096 split. 4096^3 (256 tiles: the 4th round 58/66 busy, 64 -> 57 k-tiles) does not: it measured 2 %
// slower split (docs/decisions/005-rung9-stream-k.md). Nor 2048^3 (64 tiles on 66 clusters) or whole rounds.
#ifndef TILEFUSE_RUNG9_SK_FIXUP_K_TILES  // the library's policy (a diagnostic build may change it)
static_assert(streamk_split(1024, 66, 128) && streamk_split(1024, 66, 64) && !streamk_split(256, 66, 64) &&
                  !streamk_split(64, 66, 32) && !streamk_split(132, 66, 64) && !streamk_split(16, 66, 16),
              "stream-K policy");
#endif

// Balanced rounds (see the header): how many cluster-rows to make narrow (tile_span), 0 for none. Tiles go to the
// clusters round-robin in walk order, whole ones first, so the busiest cluster is cluster 0: with T tiles of which
// W whole, its work is 15 ceil(T / C) + ceil(W / C) sixteenths of a whole tile. The y with the least, if it is less
// than without narrow rows. A narrow row needs NARROW_TILES - 1 whole tiles' columns, and its last narrow tile has
// to start inside C.
__host__ __device__ constexpr long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int balance_rows(long long tiles_m, long long tiles_n, long long clusters, long long N) {
    if (clusters < 1 || tiles_m < 1 || tiles_n < NARROW_TILES - 1 ||
        (tiles_n - (NARROW_TILES - 1)) * BN + (NARROW_TILES - 1) * NARROW_BN >= N)
        return 0;
    long long best = 16 * ceil_div(tiles_m * tiles_n, clusters);
    int best_y = 0;
    for (long long y = 1; y <= tiles_m; ++y) {
        const long long tiles = tiles_m * tiles_n + y, whole = tiles - NARROW_TILES * y;
        const long long busiest = 15 * ceil_div(tiles, clusters) + ceil_div(whole, clusters);
        if (busiest < best) {
            best = busiest;
            best_y = (int)y;
        }
    }
    return best_y;
}
// 4096^3: 16 x 16 cluster-tiles on 66 clusters, 4 rounds with the 4th 58/66 busy (64 sixteenths for cluster 0);
// 4 narrow rows: 260 tiles, cluster 0 three whole and a narrow one (63). 8192^3 (32 x 32 on 66, 16 rounds, the 16th
// 34/66 busy): 29 narrow rows, 249 sixteenths against 256 (where stream-K splits, it runs instead). Whole rounds,
// N below 15 tiles (2048^3) and an N whose last narrow tile would be empty get none.
static_assert(balance_rows(16, 16, 66, 4096) == 4 && balance_rows(32, 32, 66, 8192) == 29 &&
                  balance_rows(12, 22, 66, 5632) == 0 && balance_rows(8, 8, 66, 2048) == 0 &&
                  balance_rows(16, 16, 66, 4096 - 256 + 16) == 0 && balance_rows(16, 16, 66, 4096 - 256 + 24) == 4,
              "balanced-rounds policy");

// Stream-K: wait for slot's flag to hold this launch's epoch (thread 0 of the consumer warpgroup, acquire), then
// add the slot's partial sums to the accumulators (every thread its own 128, in the layout the writer stored).
__device__ __forceinline__ void add_partial(float (&acc)[128], const StreamK& sk, int slot, int tid, int consumer) {
    if (tid == 0) {
        const unsigned long long start = global_timer_ns();
        while (flag_acquire(sk.flags + slot) != sk.epoch) {
            if (global_timer_ns() - start > WAIT_TIMEOUT_NS) __trap();
        }
    }
    named_barrier_sync(1 + consumer, 128);  // thread 0's acquire before everyone's loads
    const float4* src = reinterpret_cast<const float4*>(sk.workspace + (size_t)slot * SK_SLOT_FLOATS) + tid;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
        // One float4 loaded and added in one asm statement, eight in flight at a time (the barrier: ptxas does not
        // move a load above one). Written as loads and adds in C++, ptxas hoisted the loads and spilled.
        if (i % 8 == 0 && i > 0) named_barrier_sync(1 + consumer, 128);
        asm volatile(
            "{\n.reg .f32 x, y, z, w;\n"
            "ld.global.cg.v4.f32 {x, y, z, w}, [%4];\n"
            "add.f32 %0, %0, x;\nadd.f32 %1, %1, y;\nadd.f32 %2, %2, z;\nadd.f32 %3, %3, w;\n}\n"
            : "+f"(acc[4 * i]), "+f"(acc[4 * i + 1]), "+f"(acc[4 * i + 2]), "+f"(acc[4 * i + 3])
            : "l"(src + i * 128)
            : "memory");
    }
    // (and none of the epilogue's bias loads above this point: hoisted into the adds, they spilled too)
    named_barrier_sync(1 + consumer, 128);
}

// One work item's k-loop (see consume): `left` k-tiles from the ring position (s, phase), each 4 wgmmas of
// m64nNWk16 (NW = BN, or NARROW_BN for a balanced schedule's narrow tiles: accumulators 0..119 only). Returns with
// every wgmma done and every stage of the item released; (s, phase) then point past its last k-tile.
template <int DT, int NW, bool PP>
__device__ __forceinline__ void mainloop(float (&acc)[128], int left, int& s, uint32_t& phase, uint32_t full,
                                         uint64_t desc_a0, uint64_t desc_b0, uint32_t release_target, uint32_t turn,
                                         int consumer, int lane) {
    static_assert(NW == BN || (NW == NARROW_BN && !PP), "ping-pong tiles are whole");
    constexpr int stages = PP ? PP_STAGES : STAGES;
    constexpr uint64_t DESC_A_STAGE = desc_field(PP ? PP_A_TILE_BYTES : A_TILE_BYTES), DESC_B_STAGE = desc_field(B_TILE_BYTES);
    // The accumulators this width's wgmmas define (no other instruction may touch one of them between its wgmmas:
    // ptxas serialises the wgmmas if one does, C7515).
    float(&d)[NW / 2] = reinterpret_cast<float(&)[NW / 2]>(acc);
    // The previous k-tile's stage (-1 before the first).
    int prev = -1;
    for (; left > 0; --left) {
        mbar_wait(full + 8 * s, phase);
        const uint64_t da = desc_a0 + (uint64_t)s * DESC_A_STAGE;
        const uint64_t db = desc_b0 + (uint64_t)s * DESC_B_STAGE;
        fence_accumulators(d);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / WGMMA_K; ++kk) {
            const uint32_t scale_d = (prev >= 0 || kk > 0) ? 1u : 0u;
            if constexpr (NW == BN) wgmma_m64n256k16<DT>(d, da + kk * DESC_K_STEP, db + kk * DESC_K_STEP, scale_d);
            else wgmma_m64n240k16<DT>(d, da + kk * DESC_K_STEP, db + kk * DESC_K_STEP, scale_d);
        }
        wgmma_commit();
        if (PP && left == 1) {  // my last stage has landed: the other consumer's turn
            if (lane == 0) mbar_arrive(turn + 8 * (1 - consumer));
            __syncwarp();
        }
        // Keep this k-tile's wgmma in flight; the previous one has finished, so release its stage
        // to the producers of both CTAs (each of them writes into this CTA's copy of it). (Releasing each
        // stage at once after a wait_group 0, a stage more of lead, measured within noise: docs/decisions/004.)
        wgmma_wait<1>();
        fence_accumulators(d);
        if (prev >= 0) release_stage(release_target, (uint32_t)prev);
        __syncwarp();  // the warp whole again before the next .sync.aligned wgmma instructions
        prev = s;
        if (++s == stages) { s = 0; phase ^= 1u; }
    }
    wgmma_wait<0>();
    fence_accumulators(d);
    release_stage(release_target, (uint32_t)prev);  // the producer goes on into the next tile
    __syncwarp();
}

// Consumers. Cooperative (PP = false): every tile of the CTA, warpgroup 1 its rows 0..63, warpgroup 2 rows
// 64..127. Ping-pong (PP = true): the CTA's tiles j = 0, 1, 2, ... alternate, warpgroup 1 the even ones, 2 the
// odd ones, each a whole 64x256 tile; a consumer starts tile j's mainloop only once the other one has waited
// for the last stage of tile j-1 (the turn barrier), so the two mainloops take turns on the tensor cores while
// each one's epilogue runs under the other's mainloop. The hand-over also keeps the parity waits exact: no
// consumer waits on a stage more than one phase ahead of it. Compile-time PP keeps each path's registers as
// they were (a run-time switch cost a spill in the GeLU epilogue).
// Stream-K (see the header) in the cooperative kernels without GeLU: in the GeLU kernel the fix-up's adds made ptxas
// spill 16 bytes, whatever the form of the adds, and the host does not split there.
template <int EPI, bool PP>
__host__ __device__ constexpr bool consumer_splits() { return !PP && EPI != 2; }

template <int DT, int EPI, bool PP>
__device__ __forceinline__ void consume(const void* smem_raw, const CUtensorMap* tm_c, void* C, const void* bias,
                                        int M, int N, int K, long long ldc, int debug, const Schedule& sched,
                                        const StreamK& sk) {
    constexpr int stages = PP ? PP_STAGES : STAGES;
    constexpr int rows = PP ? PP_BM : BM;  // rows of C a CTA's tile has
    constexpr bool SPLITS = consumer_splits<EPI, PP>();
    constexpr uint32_t a_bytes = PP ? PP_A_TILE_BYTES : A_TILE_BYTES;
    constexpr int c_buffers = PP ? PP_C_BUFFERS : C_BUFFERS;
    // The cooperative consumers read each work item from the producer's record (put_item). Ping-pong (whole tiles,
    // never split) rebuilds its walk for each tile from the kernel's arguments and the cluster registers: held
    // across the mainloop, the walk's values cost registers the consumers do not have.
    // The shared-memory base and the consumer index as warp-uniform values (broadcast from lane 0): the wgmma
    // descriptors derived from them then stay in uniform registers across the k-loop. Without it ptxas built
    // the A descriptor in ordinary registers and moved it with R2UR before every HGMMA (8 a k-tile, 16 in
    // ping-pong) and re-derived the base from S2UR SR_CgaCtaId and the index from S2R SR_TID.X every k-tile
    // (105 instructions a k-tile a warp before, 51 after: docs/decisions/004-rung9-consumer-k-loop.md).
    const uint32_t s_a = (uint32_t)warp_uniform((int)smem_base(smem_raw));
    const uint32_t s_b = s_a + stages * a_bytes, s_c = s_b + stages * B_TILE_BYTES;
    const uint32_t full = s_a + FULL_OFFSET, empty = s_a + EMPTY_OFFSET, turn = s_a + TURN_OFFSET;
    const uint32_t items = s_a + ITEM_OFFSET;
    const int consumer = warp_uniform((int)(threadIdx.x / 128)) - 1;
    // A record's tile, this consumer's first row of it, its columns and its piece bits.
    auto take_item = [consumer](const Item& item, int& t, int& m0, int& n0, int& piece) {
        t = item.t;
        m0 = item.m0 + consumer * 64;
        n0 = item.n0;
        piece = (int)((uint32_t)item.left_piece >> ITEM_PIECE_SHIFT);
    };
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, q = lane % 4;  // fragment coordinates: row g (+8), columns 2q, 2q+1 of each n8
    // Ping-pong always stores through TMA (its epilogue is off the critical path; the direct-store copy of it
    // made the kernel spill).
    const bool tma_store = PP || (debug & DEBUG_DIRECT_STORE) == 0;
    const bool warp_stores = sched.warp_stores != 0;
    const uint64_t c_policy = l2_policy((sched.l2 >> L2_C_SHIFT) & 3);  // C's stores (once: uniform registers)
    const uint32_t a_off = PP ? 0u : (uint32_t)(consumer * CONSUMER_A_BYTES);  // my rows of the stage's A
    const int csize = sched.cluster, k_tiles = (K + BK - 1) / BK;
    // Stage 0's descriptors; stage s adds s tiles (the 14-bit address field cannot carry: the ring ends below
    // 256 KB). Lane r < csize releases a stage to CTA r (see release_stage).
    const uint64_t desc_a0 = make_desc_sw128(s_a + a_off), desc_b0 = make_desc_sw128(s_b);
    const uint32_t release_target = lane < csize ? map_to_rank(empty, (uint32_t)lane) : 0u;
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;

    int s = 0;
    uint32_t phase = 0;
#if TILEFUSE_RUNG9_TRACE
    const int trace_slot = ((int)cluster_index() * csize + (int)cluster_ctarank()) * CONSUMERS + consumer;
    int trace_items = 0;
    RUNG9_TRACE(trace_slot, 0, -1, global_timer_ns());
#endif
    for (int j = PP ? consumer : 0;; j += PP ? 2 : 1) {  // j: the CTA's j-th work item (whole tiles in ping-pong)
        // Tile t, k-tiles [kb, ke); my rows from m0, the tile's columns from n0. What the code after the mainloop
        // needs of kb and ke is two bits of `piece` (registers: with stream-K's values the consumers came close to
        // running out of them, and ptxas spilled in some variants of this code).
        int t, m0, n0, left, piece;
        bool narrow = false;  // cooperative only (see tile_span)
        if constexpr (PP) {
            int kb, ke;
            const Walk w = make_walk(M, N, K, rows, csize, false, 0, 0, 0);
            if (!work_item(w, j, t, kb, ke)) break;
            const TileRC tile = tile_at(t, w.tiles_m, w.tiles_n, sched.group_m, sched.order);
            m0 = tile.row * (rows * csize) + (int)w.rank * rows;
            n0 = tile.col * BN;
            left = ke - kb;
            piece = 0;
        } else {
            // The item's record (see put_item), once the stage with its first k-tile has landed.
            mbar_wait(full + 8 * s, phase);
            const Item item = get_item(items + ITEM_BYTES * (j % ITEM_SLOTS));
            if (item.left_piece == 0) break;  // the producer's end record
            left = item.left_piece & ((1 << ITEM_PIECE_SHIFT) - 1);
            take_item(item, t, m0, n0, piece);  // (used here by the trace builds only: read again after the mainloop)
            narrow = (piece & PIECE_NARROW) != 0;
        }
        {
#if TILEFUSE_RUNG9_TRACE
            int kb = 0;
            if (!PP) asm volatile("ld.shared.b32 %0, [%1];" : "=r"(kb) : "r"(items + ITEM_BYTES * (j % ITEM_SLOTS) + 16) : "memory");
            trace_items = j + 1;
            RUNG9_TRACE(trace_slot, 0, -2, (unsigned long long)trace_items);
            RUNG9_TRACE(trace_slot, j, 4, (unsigned long long)t);
            RUNG9_TRACE(trace_slot, j, 5, (unsigned long long)(left | (piece << 16) | ((unsigned long long)kb << 32)));
            RUNG9_TRACE(trace_slot, j, 6, sm_clock());
            RUNG9_TRACE(trace_slot, j, 0, global_timer_ns());
#endif
        }
        if (PP) {
            // The producer's ring position at this tile's first k-tile (it walks every tile of the CTA), and
            // the other consumer's ((j-1)/2)-th turn arrival: the end of tile j-1's mainloop.
            const uint32_t first_it = (uint32_t)j * (uint32_t)k_tiles;
            s = (int)(first_it % stages);
            phase = (first_it / stages) & 1u;
            if (j > 0) mbar_wait(turn + 8 * consumer, (uint32_t)((j - 1) >> 1) & 1u);
        }

        if constexpr (PP) {
            mainloop<DT, BN, PP>(acc, left, s, phase, full, desc_a0, desc_b0, release_target, turn, consumer, lane);
        } else if (narrow) {  // a balanced schedule's narrow tile: m64n240k16, its first 120 accumulators
            mainloop<DT, NARROW_BN, PP>(acc, left, s, phase, full, desc_a0, desc_b0, release_target, turn, consumer, lane);
        } else {
            mainloop<DT, BN, PP>(acc, left, s, phase, full, desc_a0, desc_b0, release_target, turn, consumer, lane);
        }
        RUNG9_TRACE(trace_slot, j, 1, global_timer_ns());
        RUNG9_TRACE(trace_slot, j, 7, sm_clock());
        if constexpr (!PP) take_item(get_item(items + ITEM_BYTES * (j % ITEM_SLOTS)), t, m0, n0, piece);


        if constexpr (SPLITS) {
            // (Nothing is in flight: this wait tells ptxas so. With two k-loops in the kernel it could not see it, took
            // the fix-up's adds for writes under running wgmmas and serialised them, C7515.)
            wgmma_wait<0>();
            fence_accumulators(acc);
            // Stream-K (see the header): a piece without the tile's first k-tile leaves its sums in its slot; the
            // piece with it adds the tile's other pieces' sums before the epilogue. Whole tiles do neither.
            const int cl = (int)cluster_index(), clusters = (int)cluster_count(), rank = (int)cluster_ctarank();
            const int slot = (cl * csize + rank) * CONSUMERS + consumer;
            if (piece & PIECE_LATER) {
                float4* dst = reinterpret_cast<float4*>(sk.workspace + (size_t)slot * SK_SLOT_FLOATS) + tid;
#pragma unroll
                for (int i = 0; i < 32; ++i)
                    __stcg(dst + i * 128, make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
                // Every thread's stores before the flag: the barrier orders them before thread 0's release store, and
                // a release is cumulative (a __threadfence before it would be a second fence on this warp's path).
                named_barrier_sync(1 + consumer, 128);
                if (tid == 0) flag_release(sk.flags + slot, sk.epoch);
                RUNG9_TRACE(trace_slot, j, 2, global_timer_ns());
                RUNG9_TRACE(trace_slot, j, 3, global_timer_ns());
                continue;
            }
            if (piece & PIECE_UNFINISHED) {
                // The tile's later pieces are the first pieces of the next clusters' ranges: cluster cl + 1's, and
                // cl + 2's too where cl + 1's range ends inside this tile (streamk_split keeps a tile in <= 3 pieces).
                const bool third = sk_third_piece(sk.units, sk.dp_end, k_tiles, t, cl, clusters);
                add_partial(acc, sk, (((cl + 1) * csize + rank) * CONSUMERS + consumer), tid, consumer);
                if (third)
                    add_partial(acc, sk, (((cl + 2) * csize + rank) * CONSUMERS + consumer), tid, consumer);
            }
        }

        RUNG9_TRACE(trace_slot, j, 2, global_timer_ns());
        // A narrow tile's columns end at n0 + NARROW_BN: its accumulators 120..127 hold nothing of it, and the columns
        // after it are the next tile's.
        auto narrow_tile = [&]() { return !PP && item_narrow(items + ITEM_BYTES * (j % ITEM_SLOTS)); };
        // Whether chunk c goes out by TMA (all but a narrow tile's short chunk, which store_narrow_rows copies).
        auto tma_stored = [&](int c) { return c != NARROW_CHUNK || !narrow_tile(); };
        if (!tma_store) {
            store_fragment<DT, EPI>(acc, C, bias, M, narrow_tile() && n0 + NARROW_BN < N ? n0 + NARROW_BN : N, ldc, m0, n0,
                                    true);
            RUNG9_TRACE(trace_slot, j, 3, global_timer_ns());
            continue;
        }
        // Epilogue: four 64x64 chunks, each rounded into a swizzled staging buffer and stored by TMA, in groups of
        // GROUP chunks: a wait for the buffers and a barrier before a group, one proxy fence, a barrier and the group's
        // stores (one commit) after it. Cooperative: pairs, chunks 0-1 and then 2-3, one in each of the consumer's two
        // buffers (a chunk at a time, each with its own fence and barriers, measured 0.8 % / 0.3 % slower at 4096^3:
        // docs/decisions/008-rung9-epilogue-in-pairs.md). Ping-pong: one buffer a consumer, so a chunk at a time.
        constexpr int GROUP = c_buffers;
        // Chunk c's staging buffer.
        auto staging = [&](int c) { return s_c + (consumer * c_buffers + c % c_buffers) * C_CHUNK_BYTES; };
#pragma unroll
        for (int jc = 0; jc < BN / C_CHUNK_COLS; ++jc) {
            const uint32_t buf = staging(jc);
            RUNG9_EPI_STAMP(jc, 0);
            if (jc % GROUP == 0) {
                // The stores that last read these buffers (the previous group's) have read them: the warpgroup's one
                // issuing thread waits and the warpgroup meets at a barrier, or (warp stores) each warp waits for its
                // own rows' stores alone.
                if (warp_stores) {
                    if (lane == 0) bulk_wait_read<0>();
                    __syncwarp();
                } else {
                    if (tid == 0) bulk_wait_read<0>();
                    __syncwarp();
                    named_barrier_sync(1 + consumer, 128);
                }
            }
            RUNG9_EPI_STAMP(jc, 1);
#pragma unroll
            for (int jj = 0; jj < C_CHUNK_COLS / 8; ++jj) {
                const int col = 8 * jj + 2 * q;  // column inside the chunk
                const int gcol = n0 + jc * C_CHUNK_COLS + col;
                float b0 = 0.f, b1 = 0.f;
                if constexpr (EPI != 0) {
                    asm volatile("" ::: "memory");  // one pair's bias loads at a time (see store_fragment)
                    if (gcol < N) b0 = load_scalar<DT>(bias, gcol);
                    if (gcol + 1 < N) b1 = load_scalar<DT>(bias, gcol + 1);
                }
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int i = 4 * (jc * (C_CHUNK_COLS / 8) + jj) + 2 * h;
                    float v0 = acc[i], v1 = acc[i + 1];
                    if constexpr (EPI != 0) { v0 += b0; v1 += b1; }
                    if constexpr (EPI == 2) { v0 = gelu_erfc(v0); v1 = gelu_erfc(v1); }
                    const int row = 16 * warp + g + 8 * h;
                    st_shared_u32(buf + swizzle128_offset(row, col), pack2<DT>(v0, v1));
                }
            }
            if (!tma_stored(jc)) {
                // A narrow tile's last chunk has 48 columns of it: a 64-column box would write 16 of the next tile's.
                // Each warp copies its own 16 rows (it wrote them) to C itself, and the chunk gets no TMA store.
                __syncwarp();
                store_narrow_rows(buf, C, M, N, ldc, m0, n0 + NARROW_CHUNK * C_CHUNK_COLS);
            }
            RUNG9_EPI_STAMP(jc, 2);
            if (jc % GROUP != GROUP - 1) continue;  // the group's last chunk fences and stores them all
            fence_proxy_async_smem();
            RUNG9_EPI_STAMP(jc, 3);
            // TMA clips rows >= M, cols >= N. A box is the whole chunk (64 rows, 8 KB): one store a chunk from one
            // thread after the barrier; with warp stores one warp's 16 rows (2 KB, 1 KB-aligned in the buffer, so the
            // 128B swizzle's phase is the chunk's), one a chunk from each warp. (Four 16-row boxes a chunk from the one
            // thread issued 16 stores a tile where 4 do: 0.8 % slower at 4096^3, docs/decisions/008.)
            if (warp_stores) {
                __syncwarp();
                if (lane == 0) {
#pragma unroll
                    for (int c = jc + 1 - GROUP; c <= jc; ++c)
                        if (tma_stored(c))
                            tma_store_2d(tm_c, staging(c) + warp * C_STORE_BYTES, n0 + c * C_CHUNK_COLS,
                                         m0 + warp * C_STORE_ROWS, c_policy);
                    bulk_commit();
                }
            } else {
                named_barrier_sync(1 + consumer, 128);
                RUNG9_EPI_STAMP(jc, 4);
                if (tid == 0) {
#pragma unroll
                    for (int c = jc + 1 - GROUP; c <= jc; ++c)
                        if (tma_stored(c))
                            tma_store_2d(tm_c, staging(c), n0 + c * C_CHUNK_COLS, m0, c_policy);
                    bulk_commit();
                }
            }
            __syncwarp();
        }
        RUNG9_TRACE(trace_slot, j, TRACE_EPI_END, sm_clock());
        RUNG9_TRACE(trace_slot, j, 3, global_timer_ns());
    }
    // The stores have landed before this CTA's shared memory goes away (each committing thread waits for its own)
    if (warp_stores ? lane == 0 : tid == 0) bulk_wait<0>();
}

// A kernel a dtype and epilogue. EPI (0 none, 1 + bias, 2 GeLU(+ bias)) is a template argument:
// with the epilogue chosen at run time the unrolled epilogue branched around a bias load and an erff GeLU for every
// pair of accumulators (~180 KB of SASS to walk through for a plain tile), and ncu (4096^3, docs/decisions/003) saw the
// consumers stall on instruction fetch ("no instruction" 3.3 cycles an issued instruction, cuBLAS 0.13) with the
// tensor pipe active 76 % of the time (cuBLAS 95 %).
template <int DT, int EPI>
__global__ void __launch_bounds__(THREADS, 1)
rung9_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
             const __grid_constant__ CUtensorMap tm_c, void* C, const void* bias, int M, int N, int K, long long ldc,
             int debug, Schedule sched, StreamK sk) {
    extern __shared__ __align__(16) uint8_t smem_raw[];
    // Cooperative or ping-pong (see the header): the layout is chosen once at entry.
    const bool pp = sched.pingpong != 0;
    const int stages = pp ? PP_STAGES : STAGES;
    const int warpgroup = threadIdx.x / 128;

    if (threadIdx.x == 0) {
        const uint32_t base = smem_base(smem_raw);
        for (int s = 0; s < stages; ++s) {
            mbar_init(base + FULL_OFFSET + 8 * s, 1);  // one arrive.expect_tx by the local producer
            // Every consumer warp of both CTAs that reads the stage: both warpgroups, or (ping-pong) the one
            // whose tile it belongs to.
            mbar_init(base + EMPTY_OFFSET + 8 * s, sched.cluster * (pp ? 4 : CONSUMER_WARPS));
        }
        for (int c = 0; c < CONSUMERS; ++c) mbar_init(base + TURN_OFFSET + 8 * c, 4);  // the other consumer's warps
        fence_mbarrier_init();  // visible to the copy engine and to the peer CTA
        prefetch_tensormap(&tm_a);
        prefetch_tensormap(&tm_b);
        prefetch_tensormap(&tm_c);
    }
    // No CTA may multicast into, or arrive on, its peer's barriers before the peer initialised them.
    cluster_sync();

    if (warpgroup == 0) {
        // Producer: one thread walks this cluster's tiles and their k-tiles, `stages` ahead at most.
        regs_release<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            const int rows = pp ? PP_BM : BM;  // rows of C a CTA's tile has
            const uint32_t a_bytes = pp ? PP_A_TILE_BYTES : A_TILE_BYTES;
            const bool split = (pp ? consumer_splits<EPI, true>() : consumer_splits<EPI, false>()) && sched.streamk != 0;
            const Walk w = make_walk(M, N, K, rows, sched.cluster, split, sk.dp_end, sk.units, pp ? 0 : sched.narrow_rows);
            const bool multicast = (debug & DEBUG_NO_MULTICAST) == 0 && w.csize == CLUSTER;
            const uint32_t s_a = smem_base(smem_raw), s_b = s_a + stages * a_bytes;
            const uint32_t full = s_a + FULL_OFFSET, empty = s_a + EMPTY_OFFSET, items = s_a + ITEM_OFFSET;
            const uint32_t stage_tx = a_bytes + B_TILE_BYTES;  // own A, both B parts
            const uint64_t a_policy = l2_policy((sched.l2 >> L2_A_SHIFT) & 3);
            const uint64_t b_policy = l2_policy((sched.l2 >> L2_B_SHIFT) & 3);
            int s = 0;
            uint32_t phase = 0;
            int t, kb, ke;  // the consumers' work items: tile t, k-tiles [kb, ke)
            int j = 0;
            for (; work_item(w, j, t, kb, ke); ++j) {
                const TileSpan tile = tile_span(t, w.tiles_m, w.tiles_n, sched.group_m, sched.order, w.narrow_rows);
                const int m0 = tile.row * (rows * w.csize) + (int)w.rank * rows;
                const int n0 = tile.n0;
                const int piece = (kb > 0 ? PIECE_LATER : 0) | (ke < w.k_tiles ? PIECE_UNFINISHED : 0) |
                                  (tile.narrow ? PIECE_NARROW : 0);
                for (int kt = kb; kt < ke; ++kt) {
                    // Both CTAs' consumers released this stage (first lap: parity 1 of a fresh barrier passes).
                    mbar_wait(empty + 8 * s, phase ^ 1u);
                    if (kt == kb)
                        put_item(items + ITEM_BYTES * (j % ITEM_SLOTS), m0, n0, t, (ke - kb) | (piece << ITEM_PIECE_SHIFT), kb);
                    mbar_arrive_expect_tx(full + 8 * s, stage_tx);
                    const uint32_t a_dst = s_a + s * a_bytes, b_dst = s_b + s * B_TILE_BYTES;
                    tma_load_2d(a_dst, &tm_a, kt * BK, m0, full + 8 * s, a_policy);
                    if (multicast) {
                        // My part of the shared B tile, into both CTAs (the peer sends the other part).
                        tma_load_2d_multicast(b_dst + w.rank * B_PART_BYTES, &tm_b, kt * BK,
                                              n0 + (int)w.rank * B_PART_ROWS, full + 8 * s,
                                              (uint16_t)((1u << CLUSTER) - 1), b_policy);
                    } else {
                        // Both 128-row parts of the B tile myself (no multicast, or a cluster of one).
                        for (int part = 0; part < CLUSTER; ++part)
                            tma_load_2d(b_dst + part * B_PART_BYTES, &tm_b, kt * BK, n0 + part * B_PART_ROWS,
                                        full + 8 * s, b_policy);
                    }
                    if (++s == stages) { s = 0; phase ^= 1u; }
                }
            }
            if (!pp) {  // the end of the cooperative consumers' work: a record with no k-tiles
                mbar_wait(empty + 8 * s, phase ^ 1u);
                put_item(items + ITEM_BYTES * (j % ITEM_SLOTS), 0, 0, 0, 0, 0);
                mbar_arrive(full + 8 * s);
            }
        }
    } else {
        regs_claim<CONSUMER_REGS>();
        if (pp) consume<DT, EPI, true>(smem_raw, &tm_c, C, bias, M, N, K, ldc, debug, sched, sk);
        else consume<DT, EPI, false>(smem_raw, &tm_c, C, bias, M, N, K, ldc, debug, sched, sk);
    }
    // No CTA may exit while its peer can still arrive on its barriers.
    __syncwarp();
    cluster_sync();
}

// ---------------------------------------------------------------------------------------------------------
// Host side (tensor maps: encode_2d in hopper.cuh).
int g_debug_flags = 0;
// The schedule set by tilefuse_rung9_set_schedule; 0 in a field means the default.
int g_clusters = 0;      // clusters in the persistent grid (0: as many as can be resident)
int g_group_m = 0;       // 0: GROUP_M
int g_order = 0;         // ORDER_ROW_GROUPS
int g_cluster_size = 0;  // 0: CLUSTER
int g_pingpong = 0;      // tilefuse_rung9_set_pingpong: 0 cooperative consumers (the default), 1 ping-pong
int g_warp_stores = 0;   // tilefuse_rung9_set_stores: 0 one store thread a consumer (the default), 1 one a warp
int g_streamk = 1;       // tilefuse_rung9_set_streamk: 1 (the default) splits the last round's tiles where it pays
int g_balance = 1;       // tilefuse_rung9_set_balance: 1 (the default) narrows the last round's tiles where it pays
// tilefuse_rung9_set_l2: Schedule::l2; the default evict-normal on A's and B's loads, evict-first on C's stores
constexpr int L2_DEFAULT = (L2_EVICT_NORMAL << L2_A_SHIFT) | (L2_EVICT_NORMAL << L2_B_SHIFT) | (L2_EVICT_FIRST << L2_C_SHIFT);
int g_l2 = L2_DEFAULT;
constexpr int MAX_GROUP_M = 1 << 16;
constexpr int MAX_DEVICES = 64;
// Per device and cluster size (index csize - 1): clusters of this kernel resident at once (0: not asked yet).
int g_resident_clusters[MAX_DEVICES][CLUSTER] = {};
// Per device and dtype: the dynamic shared-memory attribute was set (a driver call worth skipping per launch).
bool g_smem_set[MAX_DEVICES][6] = {};  // [kernel_slot(dtype, epilogue)]

using KernelFn = void (*)(const CUtensorMap, const CUtensorMap, const CUtensorMap, void*, const void*, int, int, int,
                          long long, int, Schedule, StreamK);

// The kernel for a dtype and an epilogue (each holds the cooperative and the ping-pong consumers).
template <int DT>
KernelFn kernel_for_epi(int epilogue) {
    return epilogue == 0 ? rung9_kernel<DT, 0> : epilogue == 1 ? rung9_kernel<DT, 1> : rung9_kernel<DT, 2>;
}
KernelFn kernel_for(int dtype, int epilogue) { return dtype == 0 ? kernel_for_epi<0>(epilogue) : kernel_for_epi<1>(epilogue); }
int kernel_slot(int dtype, int epilogue) { return dtype + 2 * epilogue; }

// Stream-K's per-device workspace (see the header): allocated at the first launch that splits, for every SM's
// two consumer slots; flags zeroed then and whenever the epoch counter wraps. `last` is the stream of the last
// launch that used it and `done` an event recorded after that launch: a launch on another stream waits for it.
struct SkState {
    float* workspace = nullptr;
    int* flags = nullptr;
    int slots = 0;
    int epoch = 0;
    cudaEvent_t done = nullptr;
    cudaStream_t last = nullptr;
    bool used = false;  // `last` and `done` are set
};
SkState g_sk[MAX_DEVICES];
std::mutex g_sk_mutex;  // held by a splitting launch from streamk_begin to streamk_end
long long g_sk_launches = 0;  // launches that split (tilefuse_rung9_streamk_launches), under g_sk_mutex

cudaError_t streamk_begin(int device, int slots, cudaStream_t stream, StreamK* out) {
    if (device < 0 || device >= MAX_DEVICES) return cudaErrorInvalidDevice;
    SkState& st = g_sk[device];
    cudaError_t e;
    if (st.slots < slots) {
        if (st.workspace != nullptr) {  // a bigger grid than before (cannot happen on one device; kept general)
            e = cudaDeviceSynchronize();
            if (e != cudaSuccess) return e;
            cudaFree(st.workspace);
            cudaFree(st.flags);
            st.workspace = nullptr;
            st.flags = nullptr;
            st.slots = 0;
        }
        e = cudaMalloc(&st.workspace, (size_t)slots * SK_SLOT_FLOATS * sizeof(float));
        if (e != cudaSuccess) {
            st.workspace = nullptr;
            return e;
        }
        e = cudaMalloc(&st.flags, (size_t)slots * sizeof(int));
        if (e != cudaSuccess) {
            cudaFree(st.workspace);
            st.workspace = nullptr;
            st.flags = nullptr;
            return e;
        }
        e = cudaMemset(st.flags, 0, (size_t)slots * sizeof(int));
        if (e != cudaSuccess) return e;
        st.slots = slots;
        st.epoch = 0;
        if (st.done == nullptr) {
            e = cudaEventCreateWithFlags(&st.done, cudaEventDisableTiming);
            if (e != cudaSuccess) return e;
        }
    }
    if (st.used && st.last != stream) {
        e = cudaStreamWaitEvent(stream, st.done, 0);
        if (e != cudaSuccess) return e;
    }
    if (st.epoch == 0x7fffffff) {  // wrapped: no flag may hold a future epoch
        e = cudaMemsetAsync(st.flags, 0, (size_t)st.slots * sizeof(int), stream);
        if (e != cudaSuccess) return e;
        st.epoch = 0;
    }
    *out = StreamK{st.workspace, st.flags, ++st.epoch, 0, 0};
    return cudaSuccess;
}

cudaError_t streamk_end(int device, cudaStream_t stream) {
    SkState& st = g_sk[device];
    st.last = stream;
    st.used = true;
    return cudaEventRecord(st.done, stream);
}

cudaError_t allow_smem(KernelFn kernel, int device, int slot) {
    const bool cached = device >= 0 && device < MAX_DEVICES;
    if (cached && g_smem_set[device][slot]) return cudaSuccess;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
    if (e == cudaSuccess && cached) g_smem_set[device][slot] = true;
    return e;
}

void cluster_launch_config(cudaLaunchConfig_t* cfg, cudaLaunchAttribute* attr, int csize, void* stream) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)csize;  // 1 too: an explicit cluster of one CTA, the same code path
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    *cfg = cudaLaunchConfig_t{};
    cfg->blockDim = dim3(THREADS);
    cfg->dynamicSmemBytes = SMEM_BYTES;
    cfg->stream = reinterpret_cast<cudaStream_t>(stream);
    cfg->attrs = attr;
    cfg->numAttrs = 1;
}

// Clusters of `csize` CTAs that can be resident at once (asked once a device and size: the occupancy query
// costs more than the rest of the host work together). *queried = the occupancy API's answer (0 if it failed:
// then the SM count / csize is used).
cudaError_t resident_clusters(int device, int dtype, int csize, int* resident, int* queried, int* sms_out) {
    int sms = 0;
    cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) return e;
    if (sms_out) *sms_out = sms;
    const bool cached = device >= 0 && device < MAX_DEVICES;
    if (cached && g_resident_clusters[device][csize - 1] > 0 && queried == nullptr) {
        *resident = g_resident_clusters[device][csize - 1];
        return cudaSuccess;
    }
    KernelFn kernel = kernel_for(dtype, 0);  // every kernel has the same threads and shared memory
    e = allow_smem(kernel, device, kernel_slot(dtype, 0));
    if (e != cudaSuccess) return e;
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg;
    cluster_launch_config(&cfg, attr, csize, nullptr);
    cfg.gridDim = dim3((sms / csize) * csize);
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();  // a failed query is not the launch's error: fall back to the SM count
        n = 0;
    }
    if (queried) *queried = n;
    *resident = n > 0 ? n : sms / csize;
    if (cached) g_resident_clusters[device][csize - 1] = *resident;
    return cudaSuccess;
}

}  // namespace

extern "C" int tilefuse_rung9_b_layout(void) { return 1; }

#if TILEFUSE_RUNG9_TRACE
// Diagnostic builds only (see "Timeline trace"): the buffer later launches stamp into (nullptr: none), at least
// TRACE_WORDS 64-bit words a consumer warpgroup of the grid; tilefuse_rung9_trace_words says how many a slot.
extern "C" int tilefuse_rung9_set_trace(void* buffer) {
    return (int)cudaMemcpyToSymbol(g_trace, &buffer, sizeof(buffer));
}
extern "C" int tilefuse_rung9_trace_words(int* words, int* max_items, int* item_words) {
    if (words) *words = TRACE_WORDS;
    if (max_items) *max_items = TRACE_MAX_ITEMS;
    if (item_words) *item_words = TRACE_ITEM_WORDS;
    return 0;
}
#endif

extern "C" int tilefuse_rung9_requirements(int* m_multiple, int* n_multiple, int* k_multiple) {
    if (m_multiple) *m_multiple = 1;
    if (n_multiple) *n_multiple = 8;  // C is written by TMA: 16-byte row strides
    if (k_multiple) *k_multiple = 8;  // A and B are read by TMA: 16-byte row strides
    return 0;
}

// Not part of the ladder ABI: switch features off to locate a failure (see the header). Returns the old flags.
extern "C" int tilefuse_rung9_set_debug(int flags) {
    const int old = g_debug_flags;
    g_debug_flags = flags;
    return old;
}

// Not part of the ladder ABI: the schedule of later launches (see the header); 0 keeps a field's default.
// clusters >= 0 (more than can be resident is allowed: the extra ones wait for a free SM), 0 <= group_m <=
// 65536, order 0 or 1, cluster_size 0, 1 or 2. Returns cudaErrorInvalidValue (and changes nothing) otherwise.
extern "C" int tilefuse_rung9_set_schedule(int clusters, int group_m, int order, int cluster_size) {
    if (clusters < 0 || group_m < 0 || group_m > MAX_GROUP_M || (order != ORDER_ROW_GROUPS && order != ORDER_COLUMN_GROUPS) ||
        cluster_size < 0 || cluster_size > CLUSTER)
        return cudaErrorInvalidValue;
    g_clusters = clusters;
    g_group_m = group_m;
    g_order = order;
    g_cluster_size = cluster_size;
    return cudaSuccess;
}

// Not part of the ladder ABI: the consumer schedule of later launches (see the header): 0 cooperative (the
// default), 1 ping-pong. Returns cudaErrorInvalidValue (and changes nothing) for anything else.
extern "C" int tilefuse_rung9_set_pingpong(int on) {
    if (on != 0 && on != 1) return cudaErrorInvalidValue;
    g_pingpong = on;
    return cudaSuccess;
}
extern "C" int tilefuse_rung9_get_pingpong(void) { return g_pingpong; }

// Not part of the ladder ABI: who stores a C chunk of the TMA-store epilogue (see the header, "Stores"): 0 one
// thread a consumer warpgroup after a warpgroup barrier (the default), 1 each warp its own 16 rows, no barrier.
// Returns cudaErrorInvalidValue (and changes nothing) for anything but 0 or 1.
extern "C" int tilefuse_rung9_set_stores(int per_warp) {
    if (per_warp != 0 && per_warp != 1) return cudaErrorInvalidValue;
    g_warp_stores = per_warp;
    return cudaSuccess;
}
extern "C" int tilefuse_rung9_get_stores(void) { return g_warp_stores; }

// Not part of the ladder ABI: stream-K for later launches (see the header, "Stream-K"): 0 off, 1 (the default)
// where streamk_split says it pays. Returns cudaErrorInvalidValue (and changes nothing) for anything but 0 or 1.
extern "C" int tilefuse_rung9_set_streamk(int on) {
    if (on != 0 && on != 1) return cudaErrorInvalidValue;
    g_streamk = on;
    return cudaSuccess;
}
extern "C" int tilefuse_rung9_get_streamk(void) { return g_streamk; }

// Not part of the ladder ABI: balanced rounds (see the header) on (1, the default) or off (0).
extern "C" int tilefuse_rung9_set_balance(int on) {
    if (on != 0 && on != 1) return cudaErrorInvalidValue;
    g_balance = on;
    return cudaSuccess;
}
extern "C" int tilefuse_rung9_get_balance(void) { return g_balance; }

// Not part of the ladder ABI: the L2 policies of later launches (see the header, "L2 policies"), for A's loads,
// B's loads and C's stores: 0 evict-normal, 1 evict-first, 2 evict-last (default 0, 0, 1). Returns
// cudaErrorInvalidValue (and changes nothing) for anything else.
extern "C" int tilefuse_rung9_set_l2(int a, int b, int c) {
    if (a < L2_EVICT_NORMAL || a > L2_EVICT_LAST || b < L2_EVICT_NORMAL || b > L2_EVICT_LAST || c < L2_EVICT_NORMAL ||
        c > L2_EVICT_LAST)
        return cudaErrorInvalidValue;
    g_l2 = (a << L2_A_SHIFT) | (b << L2_B_SHIFT) | (c << L2_C_SHIFT);
    return cudaSuccess;
}
// out[0..2] = the policies of A, B and C as set.
extern "C" int tilefuse_rung9_get_l2(int* out) {
    if (out == nullptr) return cudaErrorInvalidValue;
    out[0] = (g_l2 >> L2_A_SHIFT) & 3;
    out[1] = (g_l2 >> L2_B_SHIFT) & 3;
    out[2] = (g_l2 >> L2_C_SHIFT) & 3;
    return cudaSuccess;
}

// Not part of the ladder ABI: how many launches of this process split their last round (stream-K), so a test or a
// benchmark can tell that a shape was split rather than infer it from the policy.
extern "C" long long tilefuse_rung9_streamk_launches(void) {
    std::lock_guard<std::mutex> lock(g_sk_mutex);
    return g_sk_launches;
}

// Not part of the ladder ABI, and needs no GPU: the stream-K plan as the kernel walks it, for tests.
// streamk_split's answer for (tiles, clusters, k_tiles) (1 or 0); with items != nullptr also cluster `cluster`'s
// work items with the split applied, 3 ints each (tile, first k-tile, end k-tile), at most `cap` of them, and with
// waits != nullptr, for each item, the clusters whose partial sums the item adds before its epilogue (4 ints an
// item, -1 for none; the kernel adds at most 2). Returns the item count, or -1 for bad arguments or a full `cap`.
extern "C" int tilefuse_rung9_streamk_plan(int tiles, int clusters, int k_tiles, int cluster, int* items, int* waits,
                                           int cap) {
    if (tiles < 0 || clusters < 1 || k_tiles < 1 || cluster < 0 || cluster >= clusters || cap < 0) return -1;
    const bool split = streamk_split(tiles, clusters, k_tiles);
    if (items == nullptr) return split ? 1 : 0;
    // a Walk for (tiles x 1) cluster-tiles of 128 x 2 rows, K = k_tiles * BK, as the kernel builds it
    const StreamK extent = streamk_extent(tiles, clusters, k_tiles);
    const Walk w = walk_for(cluster, clusters, 0, tiles * BM * CLUSTER, BN, k_tiles * BK, BM, CLUSTER, split,
                            extent.dp_end, extent.units, 0);
    int n = 0, t, kb, ke;
    for (int j = 0; work_item(w, j, t, kb, ke); ++j, ++n) {
        if (n >= cap) return -1;
        items[3 * n] = t;
        items[3 * n + 1] = kb;
        items[3 * n + 2] = ke;
        if (waits == nullptr) continue;
        for (int i = 0; i < 4; ++i) waits[4 * n + i] = -1;
        if (kb > 0 || ke == k_tiles) continue;
        // the kernel's two add_partial calls: cluster + 1's slot, and cluster + 2's where sk_third_piece says so
        waits[4 * n] = cluster + 1;
        if (sk_third_piece(extent.units, extent.dp_end, k_tiles, t, cluster, clusters)) waits[4 * n + 1] = cluster + 2;
    }
    return n;
}

// Not part of the ladder ABI, and needs no GPU: the balanced-rounds plan for tiles_m x tiles_n cluster-tiles of an
// N-column C on `clusters` clusters (the default order): with spans == nullptr the narrow rows balance_rows picks;
// otherwise every tile of the walk in order, 3 ints each (cluster-row, first column, width), at most `cap` of them.
// Returns the tile count, or -1 for bad arguments or a full `cap`.
extern "C" int tilefuse_rung9_balance_plan(int tiles_m, int tiles_n, int clusters, int N, int* spans, int cap) {
    if (tiles_m < 1 || tiles_n < 1 || clusters < 1 || N < 1 || N > tiles_n * BN || cap < 0) return -1;
    const int y = balance_rows(tiles_m, tiles_n, clusters, N);
    if (spans == nullptr) return y;
    const long long tiles = (long long)tiles_m * tiles_n + y;
    if (tiles > cap) return -1;
    for (int t = 0; t < (int)tiles; ++t) {
        const TileSpan span = tile_span(t, tiles_m, tiles_n, GROUP_M, ORDER_ROW_GROUPS, y);
        spans[3 * t] = span.row;
        spans[3 * t + 1] = span.n0;
        spans[3 * t + 2] = span.narrow ? NARROW_BN : BN;
    }
    return (int)tiles;
}

// Not part of the ladder ABI: the current schedule as set (out[0..3] = clusters, group_m, order, cluster_size,
// 0 meaning the default) and the defaults they stand for (out[4..6] = GROUP_M, ORDER_ROW_GROUPS, CLUSTER).
extern "C" int tilefuse_rung9_get_schedule(int* out) {
    if (out == nullptr) return cudaErrorInvalidValue;
    out[0] = g_clusters;
    out[1] = g_group_m;
    out[2] = g_order;
    out[3] = g_cluster_size;
    out[4] = GROUP_M;
    out[5] = ORDER_ROW_GROUPS;
    out[6] = CLUSTER;
    return cudaSuccess;
}

// Not part of the ladder ABI: occupancy facts of the current device for clusters of cluster_size CTAs
// (0: CLUSTER): what cudaOccupancyMaxActiveClusters answers (0 when the query failed), the SM count, the
// dynamic shared memory a CTA asks for, and the threads a CTA has.
extern "C" int tilefuse_rung9_occupancy(int cluster_size, int* max_active_clusters, int* sms, int* smem_bytes,
                                        int* threads) {
    const int csize = cluster_size == 0 ? CLUSTER : cluster_size;
    if (csize < 1 || csize > CLUSTER) return cudaErrorInvalidValue;
    int device = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) return e;
    int resident = 0, queried = 0;
    e = resident_clusters(device, 0, csize, &resident, &queried, sms);
    if (e != cudaSuccess) return e;
    if (max_active_clusters) *max_active_clusters = queried;
    if (smem_bytes) *smem_bytes = SMEM_BYTES;
    if (threads) *threads = THREADS;
    return cudaSuccess;
}

extern "C" int tilefuse_rung9(const void* A, const void* B, void* C, const void* bias, int M, int N, int K,
                              long long lda, long long ldb, long long ldc, int dtype, int epilogue, void* stream) {
    if (dtype != 0 && dtype != 1) return cudaErrorInvalidValue;
    if (epilogue < 0 || epilogue > 2 || (epilogue != 0 && bias == nullptr)) return cudaErrorInvalidValue;
    if (M < 0 || N < 0 || K < 0) return cudaErrorInvalidValue;
    if (M == 0 || N == 0) return cudaSuccess;
    if (K < 8 || K % 8 != 0 || lda < K || ldb < K || ldc < N) return cudaErrorInvalidValue;
    if (lda % 8 != 0 || ldb % 8 != 0 || ldc % 8 != 0) return cudaErrorInvalidValue;
    // N too, even with a wider ldc: TMA's stores clip C's last columns only to whole 16-byte units (a GPU test: at
    // N = 4090, ldc 4104, the last chunk's box wrote columns 4090-4095), as tilefuse_rung9_requirements says.
    if (N % 8 != 0) return cudaErrorInvalidValue;
    if (!aligned16(A) || !aligned16(B) || !aligned16(C)) return cudaErrorInvalidValue;

    CUtensorMap tm_a, tm_b, tm_c;
    const int pingpong = g_pingpong;
    const int warp_stores = g_warp_stores;  // C's box: a warp's 16 rows of a chunk, or the whole chunk
    const int rows = pingpong ? PP_BM : BM;  // rows of a CTA's tile: one A box a stage
    cudaError_t e = encode_2d(&tm_a, dtype, A, M, K, lda, rows, BK);
    if (e != cudaSuccess) return e;
    e = encode_2d(&tm_b, dtype, B, N, K, ldb, B_PART_ROWS, BK);
    if (e != cudaSuccess) return e;
    e = encode_2d(&tm_c, dtype, C, M, N, ldc, warp_stores ? C_STORE_ROWS : C_CHUNK_ROWS, C_CHUNK_COLS);
    if (e != cudaSuccess) return e;

    KernelFn kernel = kernel_for(dtype, epilogue);
    int device = 0;
    e = cudaGetDevice(&device);
    if (e != cudaSuccess) return e;
    e = allow_smem(kernel, device, kernel_slot(dtype, epilogue));
    if (e != cudaSuccess) return e;

    Schedule sched{g_cluster_size == 0 ? CLUSTER : g_cluster_size, g_group_m == 0 ? GROUP_M : g_group_m,
                   g_order, pingpong, warp_stores, 0, g_l2, 0};
    const int csize = sched.cluster;
    const int tiles_m = (M + rows * csize - 1) / (rows * csize), tiles_n = (N + BN - 1) / BN;
    const long long tiles = (long long)tiles_m * tiles_n;
    const int debug = g_debug_flags;

    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg;
    cluster_launch_config(&cfg, attr, csize, stream);

    // Persistent: as many clusters as can be resident at once (one CTA an SM) unless the schedule says how
    // many, never more than the tiles.
    long long clusters = tiles;
    bool all_resident = false;  // every cluster of the grid resident at once (stream-K's heads wait on later ones)
    if ((debug & DEBUG_NOT_PERSISTENT) == 0) {
        int resident = 0;
        e = resident_clusters(device, dtype, csize, &resident, nullptr, nullptr);
        if (e != cudaSuccess) return e;
        const int want = g_clusters > 0 ? g_clusters : resident;
        all_resident = want <= resident;
        if (want < clusters) clusters = want;
    }
    if (clusters < 1) clusters = 1;
    if (clusters * csize > 0x7fffffffLL) return cudaErrorInvalidValue;
    cfg.gridDim = dim3((unsigned)(clusters * csize));

    StreamK sk{nullptr, nullptr, 0, 0, 0};
    const cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
    // Stream-K's workspace, epoch and last stream are per device and shared by every host thread (ctypes releases
    // the GIL): one launch at a time holds them from the epoch's increment to the event after the launch.
    std::unique_lock<std::mutex> sk_lock;
    if (g_streamk && !pingpong && epilogue != 2 && all_resident && streamk_split(tiles, clusters, (K + BK - 1) / BK)) {
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        e = cudaStreamIsCapturing(st, &capture);
        if (e != cudaSuccess) return e;
        if (capture == cudaStreamCaptureStatusNone) {
            sk_lock = std::unique_lock<std::mutex>(g_sk_mutex);
            e = streamk_begin(device, (int)(clusters * csize) * CONSUMERS, st, &sk);
            if (e == cudaErrorMemoryAllocation) {
                // no memory for the workspace: the unsplit kernel, which needs none
                (void)cudaGetLastError();
                sk_lock.unlock();
            } else if (e != cudaSuccess) {
                return e;
            } else {
                const StreamK extent = streamk_extent((int)tiles, (int)clusters, (K + BK - 1) / BK);
                sk.dp_end = extent.dp_end;
                sk.units = extent.units;
                sched.streamk = 1;
            }
        }
    }

    // Balanced rounds (see the header) where stream-K does not split: cooperative, the default order, persistent.
    if (g_balance && !sched.streamk && !pingpong && sched.order == ORDER_ROW_GROUPS &&
        (debug & DEBUG_NOT_PERSISTENT) == 0) {
        sched.narrow_rows = balance_rows(tiles_m, tiles_n, clusters, N);
    }

    e = cudaLaunchKernelEx(&cfg, kernel, tm_a, tm_b, tm_c, C, bias, M, N, K, ldc, debug, sched, sk);
    if (e != cudaSuccess) return e;
    if (sched.streamk) {
        ++g_sk_launches;
        e = streamk_end(device, st);
        if (e != cudaSuccess) return e;
    }
    return (int)cudaGetLastError();
}

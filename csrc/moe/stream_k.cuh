// Stream-K for the indexed family (STREAMK, the mma main loop's run_stream): the work of a GEMM
// is U = X * Y * KB units, one unit = one 64-wide K block of one output tile, where X is the
// valid token blocks (up to the device's num_tokens_post_padded: never read on the host), Y the
// N blocks and KB the K blocks of a tile. Unit u is K block u % KB of tile t = u / KB, and tile t
// is N block t % Y of token block t / Y (N fastest: a CTA's consecutive tiles share their token
// rows). The launched grid of G CTAs (about one wave) splits [0, U) into G contiguous ranges,
// CTA c taking [U c / G, U (c + 1) / G): every CTA streams the same number of weight bytes
// (+-1 unit) through one continuous ring, whatever the tile grid's shape, and only blocks that
// exist on the device cost work.
//
// A CTA's range is a run of segments, one per tile it touches. A segment that covers its tile's
// whole K is stored as any tile is. The others (at most two per CTA: where its range starts and
// where it ends) meet in a workspace of 2 fp32 tiles per CTA ([G, 2, BT, BN]: slot 0 = the
// segment at the range's start, slot 1 = the one at its end): each contributor writes its
// partial there, then counts itself in the tile's counter; the last of the tile's contributors to
// arrive sums every contributor's partial in CTA order (deterministic: the plan depends only on
// U and G) and stores the bf16 rows, in the same pass, then resets the counter to 0 for the next
// launch (and CUDA-graph replays). No CTA ever waits for another.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "../common/params.cuh"
#include "epilogue.cuh"

namespace chord {

template <int BT, int BN>
struct StreamKPlan {
  // 32-bit throughout (the host refuses a launch whose buffers allow U >= 2^31): a 64-bit integer
  // division is a ~70-instruction software routine, and a segment's epilogue needs several.
  int Y;   // N blocks
  int KB;  // K blocks per tile
  int X;   // valid token blocks
  int U;   // units
  int G;   // CTAs
  int q;   // U / G
  int r;   // U % G
  int u0;  // this CTA's first unit
  int u1;  // one past its last

  __device__ __forceinline__ explicit StreamKPlan(const GemmParams& p) {
    Y = static_cast<int>(p.n / BN);
    KB = static_cast<int>(p.k / kKBlock);
    int padded = *p.num_tokens_post_padded;
    padded = padded < 0 ? 0 : padded;
    const int blocks = padded / BT + (padded % BT != 0);
    X = blocks < p.num_blocks ? blocks : static_cast<int>(p.num_blocks);
    U = X * Y * KB;
    G = static_cast<int>(gridDim.x);
    q = static_cast<int>(static_cast<unsigned>(U) / static_cast<unsigned>(G));
    r = U - q * G;
    u0 = begin(static_cast<int>(blockIdx.x));
    u1 = begin(static_cast<int>(blockIdx.x) + 1);
  }
  // First unit of CTA c (c = G: U): floor(U c / G) = c q + floor(c r / G), with c r < G^2 < 2^31.
  __device__ __forceinline__ int begin(int c) const {
    return c * q + static_cast<int>(static_cast<unsigned>(c * r) / static_cast<unsigned>(G));
  }
  // The CTA whose range holds unit u (< U): the largest c with begin(c) <= u (a floating-point
  // estimate, corrected to the exact answer).
  __device__ __forceinline__ int owner(int u) const {
    int c = static_cast<int>(static_cast<double>(u) * G / U);
    c = c < 0 ? 0 : (c > G - 1 ? G - 1 : c);
    while (c + 1 < G && begin(c + 1) <= u) ++c;
    while (c > 0 && begin(c) > u) --c;
    return c;
  }
  __device__ __forceinline__ int units_per_block() const { return Y * KB; }
};

// The output rows of the token blocks a stream-K CTA is working on: block b's in slot b & 1
// (the ring runs at most one block ahead of the epilogue: the host requires Y * KB >= STAGES).
template <int BT>
struct StreamKRows {
  int64_t out_row[2][BT];
  int expert[2];  // -1: the block has no local expert (nothing is loaded or stored)
};

// The stream-K row source: the token blocks a CTA's units pass through, in order. A main loop
// whose loads enter block b calls enter(b, chunk): the block's expert and route ids come from
// registers loaded when the loads entered the block before (only the CTA's first block waits for
// its routing), its output rows go to rows.out_row[b & 1] (the epilogue's), and the next block's
// routing starts loading. Each of this thread's activation chunks (chunk c = threadIdx.x + it *
// THREADS of BT x 8 16-byte chunks, row (c / 8) % BT: the main loops' copy plan) is handed to
// chunk(it, valid, input_row). A block without a local expert has no valid rows (expert() < 0).
template <int BT, int THREADS>
struct StreamKRowSource {
  static constexpr int kXChunks = BT * 8;
  static constexpr int kXIters = (kXChunks + THREADS - 1) / THREADS;
  StreamKRows<BT>* __restrict__ rows;
  int pf_b = -1, pf_e = -1;  // the block whose routing is in the registers below, and its expert
  int32_t pf_id[kXIters];
  int l_b = -1, l_e = -1;  // the block the loads are in, and its local expert (-1: none)

  __device__ __forceinline__ explicit StreamKRowSource(StreamKRows<BT>& r) : rows(&r) {}

  __device__ __forceinline__ void fetch(const GemmParams& p, int b) {
    pf_b = b;
    pf_e = p.expert_ids[b];
#pragma unroll
    for (int it = 0; it < kXIters; ++it) {
      const int c = static_cast<int>(threadIdx.x) + it * THREADS;
      pf_id[it] = (kXChunks % THREADS == 0 || c < kXChunks) ? p.sorted_ids[static_cast<int64_t>(b) * BT + (c / 8) % BT]
                                                          : -1;
    }
  }
  __device__ __forceinline__ int block() const { return l_b; }
  __device__ __forceinline__ int expert() const { return l_e; }

  template <class Plan, class Chunk>
  __device__ __forceinline__ void enter(const GemmParams& p, const Plan& plan, int b, Chunk&& chunk) {
    if (pf_b != b) fetch(p, b);
    l_b = b;
    l_e = pf_e >= 0 && pf_e < p.num_experts ? pf_e : -1;
    const int slot = b & 1;
#pragma unroll
    for (int it = 0; it < kXIters; ++it) {
      const int c = static_cast<int>(threadIdx.x) + it * THREADS;
      if (kXChunks % THREADS == 0 || c < kXChunks) {
        const int r = (c / 8) % BT, ch = c % 8;
        const int id = pf_id[it];
        const bool valid = l_e >= 0 && id >= 0 && id < p.num_valid_ids;
        // (32-bit division: sorted ids are int32)
        chunk(it, valid, static_cast<int64_t>(id / static_cast<int>(p.top_k)));
        if (ch == 0) rows->out_row[slot][r] = valid ? id : -1;
      }
    }
    if (threadIdx.x == 0) rows->expert[slot] = l_e;
    if ((b + 1) * plan.units_per_block() < plan.u1) fetch(p, b + 1);
  }
};

// Segment [seg_begin, seg_end) of tile t has been accumulated in `acc`: store it (whole tile),
// or add it to the tile's partials and, if this CTA is the tile's last contributor, finish the
// tile. Every thread of the CTA calls it (uniform); `smem` is the epilogue tile (after the ring,
// which may still be loading; the main loop's next CTA barrier orders this call's reads of it
// before the next segment's writes).
template <int BT, int BN, int THREADS, int MMA_WARPS, int NTW, bool SWAPPED, bool STMATRIX>
__device__ __forceinline__ void store_stream_k(const GemmParams& p, const StreamKPlan<BT, BN>& plan,
                                               const float (&acc)[NTW][BT / 8][4], int t, int seg_begin, int seg_end,
                                               const int64_t* __restrict__ out_row, uint8_t* smem) {
  using E = EpilogueConfig<BT, BN>;
  const int n_block = t % plan.Y;
  const int t_begin = t * plan.KB, t_end = t_begin + plan.KB;
  if (seg_begin == t_begin && seg_end == t_end) {
    store_tile<BT, BN, THREADS, MMA_WARPS, NTW, 1, true, SWAPPED, STMATRIX>(p, acc, n_block, out_row, smem);
    return;
  }
  __shared__ int s_last;
  const int tid = threadIdx.x;
  constexpr int kTile = BT * BN;
  float* part = p.workspace + (static_cast<int64_t>(blockIdx.x) * 2 + (seg_begin == plan.u0 ? 0 : 1)) * kTile;
  for_each_acc<BT, MMA_WARPS, NTW, SWAPPED>(acc, [&](int tok, int n, float v) { __stcg(part + tok * BN + n, v); });
  __threadfence();
  __syncthreads();
  const int c0 = plan.owner(t_begin), c1 = plan.owner(t_end - 1);
  if (tid < 32) {  // warp 0 counts the CTAs with units in this tile (an empty range, U < G, holds none)
    int contributors = 0;
    for (int c = c0 + tid; c <= c1; c += 32) contributors += plan.begin(c) < plan.begin(c + 1);
#pragma unroll
    for (int d = 16; d > 0; d /= 2) contributors += __shfl_xor_sync(0xffffffffu, contributors, d);
    if (tid == 0) s_last = atomicAdd(p.counters + t, 1) == contributors - 1;
  }
  __syncthreads();
  if (!s_last) return;  // uniform: another contributor finishes the tile
  CHORD_STAMP_CLOCK_T0(kStampFixupClk);
  __threadfence();
  // The partials, kChunk contributors at a time: their workspace offsets computed once, in
  // parallel, then kBatch x kPer loads in flight per thread before they are added in CTA order
  // (deterministic): the sum costs ~(contributors / kBatch) L2 round trips, not one per partial.
  constexpr int kVec = kTile / 4;                       // float4 per tile
  constexpr int kPer = (kVec + THREADS - 1) / THREADS;  // per thread
  constexpr int kChunk = 32;
  constexpr int kBatch = kPer >= 8 ? 1 : 8 / kPer;
  static_assert(THREADS >= kChunk, "stream-K fix-up: a thread per contributor of a chunk");
  static_assert(BN % 4 == 0, "the stream-K fix-up sums 4 features at a time");
  __shared__ int64_t s_src[kChunk];
  float4 v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int cb = c0; cb <= c1; cb += kChunk) {
    const int cn = c1 - cb + 1 < kChunk ? c1 - cb + 1 : kChunk;
    if (tid < cn) {
      const int c = cb + tid;
      const int b = plan.begin(c);
      s_src[tid] = b == plan.begin(c + 1) ? -1 : (static_cast<int64_t>(c) * 2 + (b >= t_begin ? 0 : 1)) * kTile;
    }
    __syncthreads();
    for (int j0 = 0; j0 < cn; j0 += kBatch) {
      float4 w[kBatch][kPer];
#pragma unroll
      for (int jj = 0; jj < kBatch; ++jj) {
        const int64_t src = j0 + jj < cn ? s_src[j0 + jj] : -1;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          const int q = tid + i * THREADS;
          w[jj][i] = src >= 0 && (kVec % THREADS == 0 || q < kVec)
                         ? __ldcg(reinterpret_cast<const float4*>(p.workspace + src) + q)
                         : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
#pragma unroll
      for (int jj = 0; jj < kBatch; ++jj) {
        if (j0 + jj >= cn || s_src[j0 + jj] < 0) continue;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          v[i].x += w[jj][i].x;
          v[i].y += w[jj][i].y;
          v[i].z += w[jj][i].z;
          v[i].w += w[jj][i].w;
        }
      }
    }
    __syncthreads();  // s_src is rewritten by the next chunk
  }
  __nv_bfloat16* sc = reinterpret_cast<__nv_bfloat16*>(smem);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int q = tid + i * THREADS;
    if (kVec % THREADS != 0 && q >= kVec) continue;
    const int e = q * 4;
    __nv_bfloat162* d = reinterpret_cast<__nv_bfloat162*>(sc + (e / BN) * E::kCStride + (e % BN));
    d[0] = __floats2bfloat162_rn(v[i].x, v[i].y);
    d[1] = __floats2bfloat162_rn(v[i].z, v[i].w);
  }
  if (tid == 0) p.counters[t] = 0;  // ready for the next launch (and CUDA-graph replays)
  __syncthreads();
  store_rows<BT, BN, THREADS>(p, sc, n_block, out_row);
}

}  // namespace chord

// W4A16 MoE GEMM main loop, operand-swapped mma.sync (weights = A/M side, tokens = B/N side).
//
// One CTA computes a tile of BT token rows x BN output features of one expert:
//   out[row, n] = sum_k x[row, k] * (q[e, n, k] * scale[e, n, k/32])
// Rows come from a RowSource policy (indexed / contiguous / masked routing contracts), which is
// the only thing that differs between the three kernel families. The K loop is a STAGES-deep
// cp.async pipeline of 64-wide K blocks: weights (swap16 words) and scales are copied verbatim
// into shared memory; the activation rows are gathered with an XOR swizzle so ldmatrix is
// conflict-free. Each warp owns NTW 16-row weight tiles and all BT/8 token tiles.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "dequant.cuh"
#include "ptx.cuh"

namespace chord {

constexpr int kKBlock = 64;  // K elements per pipeline stage (one swap16 k-block)

// One parameter block for every family: the host packs it with a fixed layout
// (8 pointers, 8 int64, 2 pointers), see chord/jit.py `pack_gemm_params`.
struct GemmParams {
  const __nv_bfloat16* x;              // input rows, [*, k] row-major
  const uint4* qweight;                // [E, N/16, K/64, 32] x 16 B
  const uint2* scales;                 // [E, N/16, K/64, 8] x 8 B
  __nv_bfloat16* out;                  // output rows, [*, n] row-major
  const int32_t* sorted_ids;           // indexed
  const int32_t* expert_ids;           // indexed
  const int32_t* num_tokens_post_padded;  // indexed, device scalar
  const void* expert_layout;           // contiguous: int64 offsets [E+1]; masked: int32 counts [E]
  int64_t n;
  int64_t k;
  int64_t num_experts;
  int64_t top_k;          // indexed: input row = sorted_id / top_k
  int64_t num_valid_ids;  // indexed: sentinel (M*top_k); ids >= it are padding
  int64_t num_blocks;     // indexed: blocks in the (possibly over-allocated) buffers
  int64_t max_rows;       // masked: rows per expert in the [E, max_rows, K] input
  int64_t reserved;
  float* workspace;       // split-K: fp32 partial tiles [tiles, SPLIT, BT, BN]
  int32_t* counters;      // split-K: arrival count per tile (zero between launches)
};

struct TileRows {
  int expert;  // -1: nothing to do
  int count;   // valid rows in the tile (rows >= count are padding)
};

template <int BT, int BN, int WARPS, int STAGES>
struct Swap16Config {
  static_assert(BT % 8 == 0 && BT >= 8 && BT <= 128, "BT: multiple of 8 in [8, 128]");
  static_assert(BN % (16 * WARPS) == 0, "BN: multiple of 16*WARPS");
  static_assert(STAGES >= 2, "STAGES >= 2");
  static constexpr int kThreads = WARPS * 32;
  static constexpr int kNTiles = BN / 16;          // 16-row weight tiles per CTA
  static constexpr int kNTW = kNTiles / WARPS;     // per warp
  static constexpr int kTT = BT / 8;               // 8-token MMA tiles
  static constexpr int kWBytes = kNTiles * 32 * 16;  // swap16 words per stage
  static constexpr int kSBytes = kNTiles * 8 * 8;    // scales per stage
  static constexpr int kXBytes = BT * kKBlock * 2;   // activations per stage
  static constexpr int kStageBytes = kWBytes + kSBytes + kXBytes;
  static constexpr int kCStride = BN + 8;            // epilogue tile row stride (bf16)
  static constexpr int kPipeBytes = STAGES * kStageBytes;
  static constexpr int kEpiBytes = BT * kCStride * 2;
  static constexpr int kSmemBytes = kPipeBytes > kEpiBytes ? kPipeBytes : kEpiBytes;
};

// ---------------------------------------------------------------------------------------------
// The CTA body. `in_row[r]`/`out_row[r]` (shared) hold the input/output row of tile row r, or -1.
// SPLIT > 1 (split-K): CTA z of a tile reduces K blocks [KB*z/SPLIT, KB*(z+1)/SPLIT); partial
// fp32 tiles meet in `workspace`, and the last CTA of the tile to arrive (counted in `counters`,
// reset to 0 by that CTA) sums them in z order (deterministic) and stores the bf16 rows.
template <int BT, int BN, int WARPS, int STAGES, int SPLIT = 1>
__device__ __forceinline__ void swap16_tile(const GemmParams& p, int expert, int n_block,
                                            const int64_t* __restrict__ in_row,
                                            const int64_t* __restrict__ out_row, uint8_t* smem) {
  using C = Swap16Config<BT, BN, WARPS, STAGES>;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int K = static_cast<int>(p.k);
  const int N = static_cast<int>(p.n);
  const int KB_ALL = K / kKBlock;
  const int split_z = SPLIT > 1 ? static_cast<int>(blockIdx.z) : 0;
  const int kb_begin = static_cast<int>((static_cast<int64_t>(KB_ALL) * split_z) / SPLIT);
  const int kb_end = static_cast<int>((static_cast<int64_t>(KB_ALL) * (split_z + 1)) / SPLIT);
  const int KB = kb_end - kb_begin;  // K blocks of this CTA
  const int NT = N / 16;
  const uint64_t evict_first = make_evict_first_policy();

  // Global bases for this expert / N block.
  const uint4* wbase = p.qweight + (static_cast<int64_t>(expert) * NT + n_block * C::kNTiles) * KB_ALL * 32;
  const uint2* sbase = p.scales + (static_cast<int64_t>(expert) * NT + n_block * C::kNTiles) * KB_ALL * 8;

  auto stage_ptr = [&](int s) { return smem + s * C::kStageBytes; };

  // Per-thread copy assignments, computed once: each K block only adds kb to the sources.
  constexpr int T = C::kThreads;
  constexpr int kWChunks = C::kNTiles * 32;  // 16-byte weight chunks per stage
  constexpr int kSChunks = C::kNTiles * 4;   // 16-byte scale chunks per stage
  constexpr int kXChunks = BT * 8;           // 16-byte activation chunks per stage
  constexpr int kWIters = (kWChunks + T - 1) / T;
  constexpr int kSIters = (kSChunks + T - 1) / T;
  constexpr int kXIters = (kXChunks + T - 1) / T;
  const uint32_t smem_base = smem_u32(smem);
  const uint4* wsrc[kWIters];
  const uint8_t* ssrc[kSIters];
  const __nv_bfloat16* xsrc[kXIters];
  uint32_t xdst[kXIters];
  bool xvalid[kXIters];
#pragma unroll
  for (int it = 0; it < kWIters; ++it) {
    const int c = tid + it * T;
    wsrc[it] = wbase + (static_cast<int64_t>(c / 32) * KB_ALL + kb_begin) * 32 + (c % 32);
  }
#pragma unroll
  for (int it = 0; it < kSIters; ++it) {
    const int c = tid + it * T;
    ssrc[it] = reinterpret_cast<const uint8_t*>(sbase + (static_cast<int64_t>(c / 4) * KB_ALL + kb_begin) * 8) +
               (c % 4) * 16;
  }
#pragma unroll
  for (int it = 0; it < kXIters; ++it) {
    const int c = tid + it * T;
    const int r = (c / 8) % BT, ch = c % 8;
    const int64_t row = in_row[r];
    xvalid[it] = row >= 0 && c < kXChunks;
    xsrc[it] = p.x + (row >= 0 ? row * K + kb_begin * kKBlock + ch * 8 : 0);
    xdst[it] = C::kWBytes + C::kSBytes + r * 128 + ((ch ^ (r & 7)) * 16);
  }

  auto load_stage = [&](int s, int kb) {
    const uint32_t st = smem_base + s * C::kStageBytes;
#pragma unroll
    for (int it = 0; it < kWIters; ++it) {
      const int c = tid + it * T;
      if (kWChunks % T == 0 || c < kWChunks) cp_async_16_stream_u32(st + c * 16, wsrc[it] + kb * 32, evict_first);
    }
#pragma unroll
    for (int it = 0; it < kSIters; ++it) {
      const int c = tid + it * T;
      if (kSChunks % T == 0 || c < kSChunks)
        cp_async_16_stream_u32(st + C::kWBytes + c * 16, ssrc[it] + kb * 64, evict_first);
    }
#pragma unroll
    for (int it = 0; it < kXIters; ++it) {
      const int c = tid + it * T;
      if (kXChunks % T == 0 || c < kXChunks) cp_async_16_u32(st + xdst[it], xsrc[it] + kb * kKBlock, xvalid[it]);
    }
  };

  float acc[C::kNTW][C::kTT][4];
#pragma unroll
  for (int j = 0; j < C::kNTW; ++j)
#pragma unroll
    for (int i = 0; i < C::kTT; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[j][i][c] = 0.f;

  // Prologue: STAGES-1 k-blocks in flight.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KB) load_stage(s, s);
    cp_async_commit();
  }

  for (int kb = 0; kb < KB; ++kb) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kb landed for everyone; stage kb-1 is free to overwrite
    {
      const int next = kb + STAGES - 1;
      if (next < KB) load_stage(next % STAGES, next);
      cp_async_commit();
    }
    const uint8_t* st = stage_ptr(kb % STAGES);
    const uint4* sw = reinterpret_cast<const uint4*>(st);
    const uint2* ss = reinterpret_cast<const uint2*>(st + C::kWBytes);
    const uint8_t* sx = st + C::kWBytes + C::kSBytes;

    uint4 words[C::kNTW];
    uint2 scl[C::kNTW];
#pragma unroll
    for (int j = 0; j < C::kNTW; ++j) {
      const int t = warp * C::kNTW + j;
      words[j] = sw[t * 32 + lane];
      scl[j] = ss[t * 8 + lane / 4];
    }

#pragma unroll
    for (int h = 0; h < 2; ++h) {  // two 32-wide halves = two scale groups
      uint32_t b[C::kTT][4];
#pragma unroll
      for (int i = 0; i < C::kTT; ++i) {
        const int r = i * 8 + (lane & 7);
        const int ch = 4 * h + (lane >> 3);
        ldmatrix_x4(b[i], sx + r * 128 + ((ch ^ (r & 7)) * 16));
      }
#pragma unroll
      for (int j = 0; j < C::kNTW; ++j) {
        const __nv_bfloat162 sp = as_bf162(h == 0 ? scl[j].x : scl[j].y);
        const __nv_bfloat162 s_lo = __low2bfloat162(sp);
        const __nv_bfloat162 s_hi = __high2bfloat162(sp);
#pragma unroll
        for (int ss2 = 0; ss2 < 2; ++ss2) {
          const int step = 2 * h + ss2;
          const uint32_t w = step == 0 ? words[j].x : step == 1 ? words[j].y : step == 2 ? words[j].z : words[j].w;
          uint32_t a[4];
          dequant_swap16(w, s_lo, s_hi, a);
#pragma unroll
          for (int i = 0; i < C::kTT; ++i) mma_bf16_m16n8k16(acc[j][i], a, b[i][2 * ss2], b[i][2 * ss2 + 1]);
        }
      }
    }
  }

  // Epilogue: accumulators -> bf16 tile in shared memory -> 16-byte row stores.
  cp_async_wait<0>();
  __syncthreads();
  __nv_bfloat16* sc = reinterpret_cast<__nv_bfloat16*>(smem);
  const int g = lane / 4, t4 = lane % 4;
  if constexpr (SPLIT == 1) {
#pragma unroll
    for (int j = 0; j < C::kNTW; ++j) {
      const int n0 = (warp * C::kNTW + j) * 16 + g;
#pragma unroll
      for (int i = 0; i < C::kTT; ++i) {
        const int tok = i * 8 + 2 * t4;
        sc[(tok + 0) * C::kCStride + n0] = __float2bfloat16_rn(acc[j][i][0]);
        sc[(tok + 1) * C::kCStride + n0] = __float2bfloat16_rn(acc[j][i][1]);
        sc[(tok + 0) * C::kCStride + n0 + 8] = __float2bfloat16_rn(acc[j][i][2]);
        sc[(tok + 1) * C::kCStride + n0 + 8] = __float2bfloat16_rn(acc[j][i][3]);
      }
    }
  } else {
    __shared__ int s_last;
    const int64_t tile = static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y;
    float* part = p.workspace + (tile * SPLIT + split_z) * (BT * BN);
#pragma unroll
    for (int j = 0; j < C::kNTW; ++j) {
      const int n0 = (warp * C::kNTW + j) * 16 + g;
#pragma unroll
      for (int i = 0; i < C::kTT; ++i) {
        const int tok = i * 8 + 2 * t4;
        __stcg(part + (tok + 0) * BN + n0, acc[j][i][0]);
        __stcg(part + (tok + 1) * BN + n0, acc[j][i][1]);
        __stcg(part + (tok + 0) * BN + n0 + 8, acc[j][i][2]);
        __stcg(part + (tok + 1) * BN + n0 + 8, acc[j][i][3]);
      }
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(p.counters + tile, 1) == SPLIT - 1;
    __syncthreads();
    if (!s_last) return;  // uniform: another CTA of this tile finishes it
    __threadfence();
    const float* base = p.workspace + tile * SPLIT * (BT * BN);
    for (int e = tid; e < BT * BN; e += C::kThreads) {
      float v = 0.f;
#pragma unroll
      for (int z = 0; z < SPLIT; ++z) v += __ldcg(base + z * (BT * BN) + e);
      sc[(e / BN) * C::kCStride + (e % BN)] = __float2bfloat16_rn(v);
    }
    if (tid == 0) p.counters[tile] = 0;  // ready for the next launch (and CUDA-graph replays)
  }
  __syncthreads();
  constexpr int kChunksPerRow = BN / 8;
#pragma unroll
  for (int c = tid; c < BT * kChunksPerRow; c += C::kThreads) {
    const int r = c / kChunksPerRow, ch = c % kChunksPerRow;
    const int64_t row = out_row[r];
    if (row < 0) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(sc + r * C::kCStride + ch * 8);
    *reinterpret_cast<uint4*>(p.out + row * N + static_cast<int64_t>(n_block) * BN + ch * 8) = v;
  }
}

// ---------------------------------------------------------------------------------------------
// Row sources: which expert and rows a CTA works on. Each fills in_row/out_row (shared) and
// returns the expert (-1: nothing to do, the CTA exits).

// Indexed: blockIdx.x = block of sorted ids; vLLM moe_align_block_size contract.
template <int BT>
__device__ __forceinline__ int rows_indexed(const GemmParams& p, int64_t* in_row, int64_t* out_row) {
  const int b = blockIdx.x;
  const int padded = *p.num_tokens_post_padded;
  if (static_cast<int64_t>(b) * BT >= padded || b >= p.num_blocks) return -1;
  const int e = p.expert_ids[b];
  if (e < 0 || e >= p.num_experts) return -1;
  for (int r = threadIdx.x; r < BT; r += blockDim.x) {
    const int64_t id = p.sorted_ids[static_cast<int64_t>(b) * BT + r];
    const bool valid = id >= 0 && id < p.num_valid_ids;
    in_row[r] = valid ? id / p.top_k : -1;
    out_row[r] = valid ? id : -1;
  }
  return e;
}

// Masked: blockIdx.x = e * tiles_per_expert + t over [E, max_rows, K]; rows >= count skipped.
template <int BT>
__device__ __forceinline__ int rows_masked(const GemmParams& p, int64_t* in_row, int64_t* out_row) {
  const int tiles_per_expert = static_cast<int>((p.max_rows + BT - 1) / BT);
  const int e = blockIdx.x / tiles_per_expert;
  const int t = blockIdx.x % tiles_per_expert;
  if (e >= p.num_experts) return -1;
  int count = static_cast<const int32_t*>(p.expert_layout)[e];
  count = count < 0 ? 0 : (count > p.max_rows ? static_cast<int>(p.max_rows) : count);
  if (t * BT >= count) return -1;
  for (int r = threadIdx.x; r < BT; r += blockDim.x) {
    const int local = t * BT + r;
    const int64_t row = static_cast<int64_t>(e) * p.max_rows + local;
    in_row[r] = local < count ? row : -1;
    out_row[r] = local < count ? row : -1;
  }
  return e;
}

// Contiguous: rows of expert e are [off[e], off[e+1]); blockIdx.x enumerates the per-expert
// tiles in expert order (warp 0 scans the per-expert tile counts; the grid is an upper bound).
template <int BT>
__device__ __forceinline__ int rows_contiguous(const GemmParams& p, int64_t* in_row, int64_t* out_row,
                                               int* s_expert, int64_t* s_first) {
  const int64_t* off = static_cast<const int64_t*>(p.expert_layout);
  const int E = static_cast<int>(p.num_experts);
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const int64_t tile = blockIdx.x;
    int64_t base = 0;
    int found = -1;
    int64_t first = 0;
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int e = e0 + lane;
      int64_t lo = 0, cnt = 0;
      if (e < E) {
        lo = off[e];
        cnt = off[e + 1] - lo;
        if (cnt < 0) cnt = 0;
      }
      const int64_t tiles = (cnt + BT - 1) / BT;
      int64_t incl = tiles;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int64_t v = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += v;
      }
      const unsigned hit = __ballot_sync(0xffffffffu, base + incl > tile);
      if (hit) {
        const int l = __ffs(hit) - 1;
        if (lane == l) {
          found = e;
          first = lo + (tile - (base + incl - tiles)) * BT;
        }
        found = __shfl_sync(0xffffffffu, found, l);
        first = __shfl_sync(0xffffffffu, first, l);
        break;
      }
      base += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) {
      *s_expert = found;
      *s_first = first;
    }
  }
  __syncthreads();
  const int e = *s_expert;
  if (e < 0) return -1;
  const int64_t first = *s_first;
  const int64_t end = off[e + 1];
  for (int r = threadIdx.x; r < BT; r += blockDim.x) {
    const int64_t row = first + r;
    in_row[r] = row < end ? row : -1;
    out_row[r] = row < end ? row : -1;
  }
  return e;
}

enum class Family : int { kIndexed = 0, kContiguous = 1, kMasked = 2 };

template <Family F, int BT, int BN, int WARPS, int STAGES, int SPLIT = 1>
__device__ __forceinline__ void w4a16_gemm(const GemmParams& p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int64_t in_row[BT];
  __shared__ int64_t out_row[BT];
  __shared__ int s_expert;
  __shared__ int64_t s_first;
  int e;
  if constexpr (F == Family::kIndexed) {
    e = rows_indexed<BT>(p, in_row, out_row);
  } else if constexpr (F == Family::kMasked) {
    e = rows_masked<BT>(p, in_row, out_row);
  } else {
    e = rows_contiguous<BT>(p, in_row, out_row, &s_expert, &s_first);
  }
  if (e < 0) return;  // uniform across the CTA
  __syncthreads();
  swap16_tile<BT, BN, WARPS, STAGES, SPLIT>(p, e, blockIdx.y, in_row, out_row, smem);
}

}  // namespace chord

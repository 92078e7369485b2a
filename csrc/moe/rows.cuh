// Row sources and tile order: which expert, which token rows and which N block a CTA works on.
//
// The grid is (X token tiles, Y = N / (BN * NTILES) blocks, SPLIT). `tile_coords` maps the CTA
// to its (token tile, N block): RASTER = 0 keeps launch order (token tile fastest over all
// experts, then the next N block); RASTER = R walks groups of R consecutive token tiles over
// every N block, token tile fastest, so the weight slices of one expert are read from HBM once per
// group while its activation rows stay in L2 (token tiles of one expert are consecutive in
// every family).
//
// Each row source fills in_row/out_row (shared) for tile row r (or -1) and returns the expert
// (-1: nothing to do, the CTA exits).
#pragma once

#include <cstdint>

#include "../common/params.cuh"

namespace chord {

struct TileCoords {
  int m_tile;
  int n_block;
};

template <int RASTER>
__device__ __forceinline__ TileCoords tile_coords() {
  if constexpr (RASTER <= 0) {
    return {static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y)};
  } else {
    const int64_t X = gridDim.x, Y = gridDim.y;
    const int64_t lin = static_cast<int64_t>(blockIdx.y) * X + blockIdx.x;
    const int64_t per_group = static_cast<int64_t>(RASTER) * Y;
    const int64_t first = (lin / per_group) * RASTER;
    const int64_t size = (X - first) < RASTER ? (X - first) : RASTER;
    const int64_t in_group = lin % per_group;
    return {static_cast<int>(first + in_group % size), static_cast<int>(in_group / size)};
  }
}

// Indexed: m_tile = block of sorted ids; vLLM moe_align_block_size contract.
template <int BT>
__device__ __forceinline__ int rows_indexed(const GemmParams& p, int b, int64_t* in_row, int64_t* out_row) {
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

// Masked: m_tile = e * tiles_per_expert + t over [E, max_rows, K]; rows >= count skipped.
template <int BT>
__device__ __forceinline__ int rows_masked(const GemmParams& p, int m_tile, int64_t* in_row, int64_t* out_row) {
  const int tiles_per_expert = static_cast<int>((p.max_rows + BT - 1) / BT);
  const int e = m_tile / tiles_per_expert;
  const int t = m_tile % tiles_per_expert;
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

__device__ __forceinline__ int64_t clamp_row(int64_t v, int64_t rows) { return v < 0 ? 0 : (v > rows ? rows : v); }

// Contiguous: rows of expert e are [off[e], off[e+1]); m_tile enumerates the per-expert tiles in
// expert order (warp 0 scans the per-expert tile counts; the grid is an upper bound). Whatever
// the offsets say, only rows [0, p.rows) of x and out are touched: each offset is clamped to
// [0, rows] and an expert's end to at least its start (bad offsets cost that call's answer,
// never memory safety; the host check in chord.ops reports them by default).
template <int BT>
__device__ __forceinline__ int rows_contiguous(const GemmParams& p, int m_tile, int64_t* in_row, int64_t* out_row,
                                               int* s_expert, int64_t* s_first) {
  const int64_t* off = static_cast<const int64_t*>(p.expert_layout);
  const int E = static_cast<int>(p.num_experts);
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const int64_t tile = m_tile;
    int64_t base = 0;
    int found = -1;
    int64_t first = 0;
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int e = e0 + lane;
      int64_t lo = 0, cnt = 0;
      if (e < E) {
        lo = clamp_row(off[e], p.rows);
        cnt = clamp_row(off[e + 1], p.rows) - lo;
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
  const int64_t end = clamp_row(off[e + 1], p.rows);
  for (int r = threadIdx.x; r < BT; r += blockDim.x) {
    const int64_t row = first + r;
    in_row[r] = row < end ? row : -1;
    out_row[r] = row < end ? row : -1;
  }
  return e;
}

}  // namespace chord

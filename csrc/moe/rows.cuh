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
#include "../common/ptx.cuh"

namespace chord {

struct TileCoords {
  int m_tile;
  int n_block;
};

// Tile `lin` of an X x Y grid of (token tile, N block) in launch order (token tile fastest), or
// in raster groups of RASTER token tiles.
// (32-bit: a grid has fewer than 2^31 tiles; unsigned division is the cheapest the SM has.)
template <int RASTER>
__device__ __forceinline__ TileCoords tile_at(int lin, int X, int Y) {
  const unsigned l = static_cast<unsigned>(lin);
  if constexpr (RASTER <= 0) {
    return {static_cast<int>(l % static_cast<unsigned>(X)), static_cast<int>(l / static_cast<unsigned>(X))};
  } else {
    const unsigned per_group = static_cast<unsigned>(RASTER) * static_cast<unsigned>(Y);
    const unsigned group = l / per_group;
    const unsigned first = group * RASTER;
    const unsigned left = static_cast<unsigned>(X) - first;
    const unsigned size = left < RASTER ? left : RASTER;
    const unsigned in_group = l - group * per_group;
    const unsigned n = in_group / size;
    return {static_cast<int>(first + (in_group - n * size)), static_cast<int>(n)};
  }
}

// CLUSTER_N > 1: the grid's clusters of CLUSTER_N CTAs along Y (blockIdx.y % CLUSTER_N is the
// CTA's rank) are the tiles of an X x Y / CLUSTER_N grid in the same order, each covering
// CLUSTER_N neighbouring N blocks of one token tile: the hardware starts a cluster's CTAs
// together (on SMs of one GPC), so the pair reads the tile's token rows at the same time.
// tile_coords_of: the same for the CTA at (bx, by) of the launched grid (moe/prefetch.cuh asks it
// for the CTAs after this one).
template <int RASTER, int CLUSTER_N = 1>
__device__ __forceinline__ TileCoords tile_coords_of(unsigned bx, unsigned by) {
  if constexpr (CLUSTER_N > 1) {
    const int rank = static_cast<int>(by % CLUSTER_N);
    const int y = static_cast<int>(by / CLUSTER_N), Y = static_cast<int>(gridDim.y / CLUSTER_N);
    TileCoords c = RASTER <= 0 ? TileCoords{static_cast<int>(bx), y}
                               : tile_at<RASTER>(y * static_cast<int>(gridDim.x) + static_cast<int>(bx),
                                                 static_cast<int>(gridDim.x), Y);
    c.n_block = c.n_block * CLUSTER_N + rank;
    return c;
  } else if constexpr (RASTER <= 0) {
    return {static_cast<int>(bx), static_cast<int>(by)};
  } else {
    return tile_at<RASTER>(static_cast<int>(by * gridDim.x + bx), static_cast<int>(gridDim.x),
                           static_cast<int>(gridDim.y));
  }
}

template <int RASTER, int CLUSTER_N = 1>
__device__ __forceinline__ TileCoords tile_coords() {
  return tile_coords_of<RASTER, CLUSTER_N>(blockIdx.x, blockIdx.y);
}

// Indexed tile row r from its sorted id: input row id / top_k, output row id, or -1 for padding
// (ids outside [0, num_valid_ids)).
__device__ __forceinline__ void indexed_row(const GemmParams& p, int r, int64_t id, int64_t* in_row, int64_t* out_row) {
  const bool valid = id >= 0 && id < p.num_valid_ids;
  in_row[r] = valid ? id / p.top_k : -1;
  out_row[r] = valid ? id : -1;
}

// Indexed: m_tile = block of sorted ids; vLLM moe_align_block_size contract.
template <int BT>
__device__ __forceinline__ int rows_indexed(const GemmParams& p, int b, int64_t* in_row, int64_t* out_row) {
  const int padded = *p.num_tokens_post_padded;
  if (static_cast<int64_t>(b) * BT >= padded || b >= p.num_blocks) return -1;
  const int e = p.expert_ids[b];
  if (e < 0 || e >= p.num_experts) return -1;
  for (int r = threadIdx.x; r < BT; r += blockDim.x)
    indexed_row(p, r, p.sorted_ids[static_cast<int64_t>(b) * BT + r], in_row, out_row);
  return e;
}

// Masked: an expert's row count clamped to [0, max_rows] (what the kernel trusts).
__device__ __forceinline__ int masked_count(const GemmParams& p, int count) {
  return count < 0 ? 0 : (count > p.max_rows ? static_cast<int>(p.max_rows) : count);
}

// Masked: the rows of tile t of expert e ([E, max_rows, K]); rows >= count are -1.
template <int BT>
__device__ __forceinline__ void masked_rows(const GemmParams& p, int e, int t, int count, int64_t* in_row,
                                            int64_t* out_row) {
  for (int r = threadIdx.x; r < BT; r += blockDim.x) {
    const int local = t * BT + r;
    const int64_t row = static_cast<int64_t>(e) * p.max_rows + local;
    in_row[r] = local < count ? row : -1;
    out_row[r] = local < count ? row : -1;
  }
}

// Masked: m_tile = e * tiles_per_expert + t over [E, max_rows, K]; rows >= count skipped.
template <int BT>
__device__ __forceinline__ int rows_masked(const GemmParams& p, int m_tile, int64_t* in_row, int64_t* out_row) {
  const int tiles_per_expert = static_cast<int>((p.max_rows + BT - 1) / BT);
  const int e = m_tile / tiles_per_expert;
  const int t = m_tile % tiles_per_expert;
  if (e >= p.num_experts) return -1;
  const int count = masked_count(p, static_cast<const int32_t*>(p.expert_layout)[e]);
  if (t * BT >= count) return -1;
  masked_rows<BT>(p, e, t, count, in_row, out_row);
  return e;
}

__device__ __forceinline__ int64_t clamp_row(int64_t v, int64_t rows) { return v < 0 ? 0 : (v > rows ? rows : v); }

// Contiguous: which expert token tile m_tile belongs to (-1: past the last) and its first row, in
// every lane of the calling warp (all 32 lanes call it, `lane` its lane): the lanes scan the
// per-expert tile counts 32 experts at a time. RELAXED: the offsets are read with
// ld_relaxed_gpu (moe/prefetch.cuh's guess before the grid-dependency wait), else plainly.
struct ContiguousHit {
  int expert;     // -1: past the last expert's tiles
  int64_t first;  // the tile's first row
};
template <int BT, bool RELAXED = false>
__device__ __forceinline__ ContiguousHit contiguous_find(const GemmParams& p, int m_tile, int lane) {
  const int64_t* off = static_cast<const int64_t*>(p.expert_layout);
  const int E = static_cast<int>(p.num_experts);
  const int64_t tile = m_tile;
  int64_t base = 0;
  int found = -1;
  int64_t first = 0;
  for (int e0 = 0; e0 < E; e0 += 32) {
    const int e = e0 + lane;
    int64_t lo = 0, cnt = 0;
    if (e < E) {
      if constexpr (RELAXED) {
        lo = clamp_row(ld_relaxed_gpu(off + e), p.rows);
        cnt = clamp_row(ld_relaxed_gpu(off + e + 1), p.rows) - lo;
      } else {
        lo = clamp_row(off[e], p.rows);
        cnt = clamp_row(off[e + 1], p.rows) - lo;
      }
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
  return {found, first};
}

// Contiguous: rows of expert e are [off[e], off[e+1]); m_tile enumerates the per-expert tiles in
// expert order (warp 0 scans the per-expert tile counts, contiguous_find; the grid is an upper
// bound). Whatever the offsets say, only rows [0, p.rows) of x and out are touched: each offset is
// clamped to [0, rows] and an expert's end to at least its start (bad offsets cost that call's
// answer, never memory safety; the host check in chord.ops reports them by default).
template <int BT>
__device__ __forceinline__ int rows_contiguous(const GemmParams& p, int m_tile, int64_t* in_row, int64_t* out_row,
                                               int* s_expert, int64_t* s_first) {
  const int64_t* off = static_cast<const int64_t*>(p.expert_layout);
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const ContiguousHit hit = contiguous_find<BT>(p, m_tile, lane);
    if (lane == 0) {
      *s_expert = hit.expert;
      *s_first = hit.first;
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

// Contiguous: the token tiles of all experts (warp 0 sums them; every thread gets the total).
template <int BT>
__device__ __forceinline__ int64_t contiguous_tiles(const GemmParams& p, int64_t* s_total) {
  const int64_t* off = static_cast<const int64_t*>(p.expert_layout);
  const int E = static_cast<int>(p.num_experts);
  if (threadIdx.x < 32) {
    int64_t sum = 0;
    for (int e = threadIdx.x; e < E; e += 32) {
      const int64_t lo = clamp_row(off[e], p.rows);
      int64_t cnt = clamp_row(off[e + 1], p.rows) - lo;
      if (cnt < 0) cnt = 0;
      sum += (cnt + BT - 1) / BT;
    }
#pragma unroll
    for (int d = 16; d > 0; d /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, d);
    if (threadIdx.x == 0) *s_total = sum;
  }
  __syncthreads();
  return *s_total;
}

// Persistent CTAs: the tiles of an X x Y grid (token tiles x N blocks), X from the device's
// routing (indexed: the padded blocks up to num_tokens_post_padded, never read on the host;
// contiguous: the experts' token tiles; masked: every expert's max_rows tiles, those past its
// count skipped), walked in the launched grid's order (tile_at) with a stride of gridDim.x.
//
// A tile's rows live in one of kBuffers row buffers (tile t of the CTA in buffer t % 3: the
// current tile, the next one the ring is loading, and the one after it). prefetch() issues the
// global loads of the CTA's next candidate tile into registers (indexed: its expert id and
// sorted ids; masked: its expert's count); commit(buf) turns them into rows in buffer buf and
// prefetches the next candidate, skipping tiles without work. Committed at the end of a tile,
// its loads have had a whole tile to arrive, so routing latency stays off the critical path;
// commit needs no barrier of its own (the caller's next CTA barrier publishes the rows, and
// buffer buf was last read two tiles ago). Contiguous tiles are found by a scan at commit time
// (rows_contiguous, with its barrier). Every thread calls both (uniform).
//
// DYNAMIC (persistent=1 with queue=1): the CTA's first tile is still blockIdx.x, every later one
// is claimed from a work queue, p.counters[0] (atomicAdd by thread 0, handed to the CTA through
// shared memory between two CTA barriers; claims count from gridDim.x), so a CTA that finishes
// early takes the next unclaimed tile instead of the one a stride of gridDim.x away. A CTA that
// meets the end of the queue counts itself in p.counters[1]; the last of the grid resets both to
// zero (every other CTA has made its last claim by then), so the queue starts at zero at every
// launch and graph replay, as split-K's counters do. Same tiles, same per-tile arithmetic: the
// output bits equal the static walk's.
template <Family F, int BT, int BN, int RASTER, int THREADS, bool DYNAMIC = false>
struct TileWalker {
  static constexpr int kBuffers = 3;
  static constexpr int kPer = (BT + THREADS - 1) / THREADS;  // sorted ids per thread (indexed)
  int64_t (*rows_in)[BT];
  int64_t (*rows_out)[BT];
  int* s_expert;     // [kBuffers]: expert of the tile in each buffer
  int* s_nblock;     // [kBuffers]: its N block
  int* s_scratch;    // rows_contiguous's expert
  int64_t* s_first;  // rows_contiguous's first row
  int X, Y, total, lin;
  int* s_claim = nullptr;  // DYNAMIC: thread 0's claim, read by every thread
  bool claims = false;     // DYNAMIC: the next candidate comes from the queue (the first is blockIdx.x)
  bool finished = false;   // DYNAMIC: this CTA has met the end of the queue and counted itself
  // the prefetched candidate
  bool pf_some;
  TileCoords pf_tc;
  int pf_e;                // indexed: expert id; masked: the count
  int32_t pf_id[kPer];     // indexed: sorted ids of its rows

  __device__ __forceinline__ TileWalker(const GemmParams& p, int64_t (*in)[BT], int64_t (*out)[BT], int* expert3,
                                        int* nblock3, int* scratch, int64_t* first, int* claim = nullptr)
      : rows_in(in), rows_out(out), s_expert(expert3), s_nblock(nblock3), s_scratch(scratch), s_first(first),
        s_claim(claim) {
    Y = static_cast<int>(p.n / BN);
    if constexpr (F == Family::kIndexed) {
      int64_t padded = *p.num_tokens_post_padded;
      padded = padded < 0 ? 0 : padded;
      const int64_t blocks = (padded + BT - 1) / BT;
      X = static_cast<int>(blocks < p.num_blocks ? blocks : p.num_blocks);
    } else if constexpr (F == Family::kMasked) {
      X = static_cast<int>(p.num_experts * ((p.max_rows + BT - 1) / BT));
    } else {
      X = static_cast<int>(contiguous_tiles<BT>(p, first));
    }
    total = X * Y;
    lin = blockIdx.x;
    prefetch(p);
  }
  __device__ __forceinline__ int expert(int buf) const { return s_expert[buf]; }
  __device__ __forceinline__ int n_block(int buf) const { return s_nblock[buf]; }
  __device__ __forceinline__ const int64_t* in_rows(int buf) const { return rows_in[buf]; }
  __device__ __forceinline__ const int64_t* out_rows(int buf) const { return rows_out[buf]; }

  // DYNAMIC: the next unclaimed tile index (uniform). The first barrier keeps thread 0 from
  // overwriting the previous claim before every thread has read it.
  __device__ __forceinline__ int claim(const GemmParams& p) {
    __syncthreads();
    if (threadIdx.x == 0) *s_claim = static_cast<int>(gridDim.x) + atomicAdd(p.counters, 1);
    __syncthreads();
    return *s_claim;
  }

  // DYNAMIC: this CTA makes no more claims; the grid's last such CTA resets the queue.
  __device__ __forceinline__ void finish(const GemmParams& p) {
    if (finished) return;
    finished = true;
    if (threadIdx.x == 0) {
      __threadfence();  // this CTA's claims are performed before it counts itself
      if (atomicAdd(p.counters + 1, 1) == static_cast<int>(gridDim.x) - 1) {
        atomicExch(p.counters, 0);
        atomicExch(p.counters + 1, 0);
      }
    }
  }

  __device__ __forceinline__ void prefetch(const GemmParams& p) {
    if constexpr (DYNAMIC) {
      if (claims) lin = claim(p);
      claims = true;
    }
    pf_some = lin < total;
    if (!pf_some) {
      if constexpr (DYNAMIC) finish(p);
      return;
    }
    pf_tc = tile_at<RASTER>(lin, X, Y);
    if constexpr (!DYNAMIC) lin += gridDim.x;
    if constexpr (F == Family::kIndexed) {
      const int64_t b = pf_tc.m_tile;  // < X: inside the buffers and below the padded count
      pf_e = p.expert_ids[b];
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int r = threadIdx.x + j * THREADS;
        pf_id[j] = (kPer * THREADS == BT || r < BT) ? p.sorted_ids[b * BT + r] : -1;
      }
    } else if constexpr (F == Family::kMasked) {
      const int tiles_per_expert = static_cast<int>((p.max_rows + BT - 1) / BT);
      pf_e = static_cast<const int32_t*>(p.expert_layout)[pf_tc.m_tile / tiles_per_expert];
    }
  }

  __device__ __forceinline__ bool commit(const GemmParams& p, int buf) {
    while (pf_some) {
      int e = -1;
      if constexpr (F == Family::kIndexed) {
        if (pf_e >= 0 && pf_e < p.num_experts) {
          e = pf_e;
#pragma unroll
          for (int j = 0; j < kPer; ++j) {
            const int r = threadIdx.x + j * THREADS;
            if (kPer * THREADS == BT || r < BT) indexed_row(p, r, pf_id[j], rows_in[buf], rows_out[buf]);
          }
        }
      } else if constexpr (F == Family::kMasked) {
        const int tiles_per_expert = static_cast<int>((p.max_rows + BT - 1) / BT);
        const int ex = pf_tc.m_tile / tiles_per_expert, t = pf_tc.m_tile % tiles_per_expert;
        const int count = masked_count(p, pf_e);
        if (t * BT < count) {
          e = ex;
          masked_rows<BT>(p, ex, t, count, rows_in[buf], rows_out[buf]);
        }
      } else {
        e = rows_contiguous<BT>(p, pf_tc.m_tile, rows_in[buf], rows_out[buf], s_scratch, s_first);
      }
      const int nb = pf_tc.n_block;
      prefetch(p);
      if (e >= 0) {
        if (threadIdx.x == 0) {
          s_expert[buf] = e;
          s_nblock[buf] = nb;
        }
        return true;
      }
    }
    return false;
  }
};

}  // namespace chord

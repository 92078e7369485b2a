// PDL that prefetches (Cfg::kPdlPrefetch, with Cfg::kPdl): what a CTA does before
// griddepcontrol.wait, while the previous grid on the stream may still be running.
//
// The weights and scales are never written by the kernel before (a layer's weights are constant),
// so they are the one input a GEMM may request before the wait. Warp 0 of each CTA of about the
// first wave (%nsmid x kCtasPerSm CTAs) guesses, for a run of the grid's CTAs, which expert each
// will work on, from the routing as it reads now (relaxed loads, common/ptx.cuh ld_relaxed_gpu),
// and asks the copy engine to bring those CTAs' first ring of K blocks (min(stages, the CTA's K
// blocks) of words and scales of its first N block) into L2 (cp.async.bulk.prefetch.L2). Nothing
// here writes memory or decides a result: a guess that turns out wrong (the routing was being
// rewritten) costs bytes, never bits; after the wait the kernel reads the routing again.
//
// How far ahead: each of those CTAs covers `per` consecutive CTAs of the grid, so that the first
// wave asks for at most kBudgetBytes (about half of the H200's 50 MB L2); TP8 one token's down
// GEMM (896 CTAs of 4 K blocks, 7.3 MB of weights) is asked for whole while gate_up ends. The
// grouped-contiguous family finds an expert by a warp-wide scan of the offsets, so there each CTA
// asks only for its own tile. A main loop with warp-private rings (MmaDirect) is served by
// WarpRingPrefetch below instead: each warp copies its own first stages into shared memory.
#pragma once

#include <cstdint>

#include "../common/params.cuh"
#include "../common/ptx.cuh"
#include "../common/tma.cuh"
#include "rows.cuh"

namespace chord {

template <class Cfg>
struct FirstStagePrefetch {
  static constexpr Family F = Cfg::kFamily;
  static constexpr int BT = Cfg::kBlockM;
  static constexpr int kTiles = Cfg::kBlockN / 16;  // 16-row weight tiles per N block
  static constexpr int kStages = Cfg::kStages;
  static constexpr int64_t kWordBytes = 512;  // one tile's K block of swap16 words
  static constexpr int64_t kScaleBytes = 64;  // ... and of its scales
  static constexpr int64_t kBudgetBytes = int64_t{24} << 20;
  static constexpr int64_t kCtaBytes = int64_t{kStages} * kTiles * (kWordBytes + kScaleBytes);

  // The expert the CTA at token tile m_tile will work on, as the routing reads now (-1: none).
  __device__ __forceinline__ static int guess_expert(const GemmParams& p, int m_tile) {
    if constexpr (F == Family::kIndexed) {
      const int padded = ld_relaxed_gpu(p.num_tokens_post_padded);
      if (static_cast<int64_t>(m_tile) * BT >= padded || m_tile >= p.num_blocks) return -1;
      const int e = ld_relaxed_gpu(p.expert_ids + m_tile);
      return e >= 0 && e < p.num_experts ? e : -1;
    } else {
      static_assert(F == Family::kMasked, "the contiguous family guesses by a warp-wide scan (run)");
      const int tiles_per_expert = static_cast<int>((p.max_rows + BT - 1) / BT);
      const int e = m_tile / tiles_per_expert;
      if (e >= p.num_experts) return -1;
      const int count = masked_count(p, ld_relaxed_gpu(static_cast<const int32_t*>(p.expert_layout) + e));
      return (m_tile % tiles_per_expert) * BT < count ? e : -1;
    }
  }

  // The first ring of the CTA at grid position (bx, by, bz), for expert e: its first N block's
  // kTiles weight tiles at K blocks [kb_begin, kb_begin + min(stages, its K blocks)). Within a
  // tile group (common/params.cuh Swap16Layout) consecutive K blocks of its G tiles are one run,
  // so a CTA whose tiles are whole groups asks for one run per group; any other CTA (BN < 16 G, or
  // BN not a multiple of 16 G, where its tiles may straddle groups) for one run per K block and
  // piece of a group. Every request lies inside expert e's tiles [t0, t0 + kTiles).
  __device__ __forceinline__ static void prefetch_cta(const GemmParams& p, int e, unsigned bx, unsigned by,
                                                      unsigned bz) {
    const TileCoords tc = tile_coords_of<Cfg::kRaster, Cfg::kClusterN>(bx, by);
    const KRange kr = split_k_range(p, static_cast<int>(bz), Cfg::kSplitK);
    const int kb_begin = kr.begin;
    const int kbs = kr.end - kr.begin < kStages ? kr.end - kr.begin : kStages;
    if (kbs <= 0) return;
    const Swap16Layout<kTiles> lay(p, e);
    const int g = lay.group();
    const int t0 = tc.n_block * Cfg::kNTilesPerCta * kTiles;  // a multiple of kTiles
    const uint8_t* words = reinterpret_cast<const uint8_t*>(p.qweight);
    const uint8_t* scales = reinterpret_cast<const uint8_t*>(p.scales);
    if (kTiles % g == 0) {  // whole groups (t0 is a multiple of g too): K blocks kb_begin.. are one run
      for (int t = 0; t < kTiles; t += g) {
        const int64_t b = lay.block(t0 + t, kb_begin);
        bulk_prefetch_l2(words + b * kWordBytes, static_cast<uint32_t>(kbs * g * kWordBytes));
        bulk_prefetch_l2(scales + b * kScaleBytes, static_cast<uint32_t>(kbs * g * kScaleBytes));
      }
    } else {
      for (int t = 0; t < kTiles;) {  // the piece of a group from tile t0 + t on
        const int left = g - ((t0 + t) & (g - 1));
        const int run = left < kTiles - t ? left : kTiles - t;
        for (int kb = kb_begin; kb < kb_begin + kbs; ++kb) {
          const int64_t b = lay.block(t0 + t, kb);
          bulk_prefetch_l2(words + b * kWordBytes, static_cast<uint32_t>(run * kWordBytes));
          bulk_prefetch_l2(scales + b * kScaleBytes, static_cast<uint32_t>(run * kScaleBytes));
        }
        t += run;
      }
    }
  }

  // Warp 0 of every CTA, before griddep_wait.
  __device__ __forceinline__ static void run(const GemmParams& p) {
    const unsigned lane = threadIdx.x;
    const unsigned gx = gridDim.x, gy = gridDim.y;
    const unsigned ctas = gx * gy * gridDim.z;
    const unsigned me = blockIdx.x + gx * (blockIdx.y + gy * blockIdx.z);
    if constexpr (F == Family::kContiguous) {
      const int e = contiguous_find<BT, true>(p, tile_coords<Cfg::kRaster, Cfg::kClusterN>().m_tile,
                                              static_cast<int>(lane)).expert;
      if (lane == 0 && e >= 0) prefetch_cta(p, e, blockIdx.x, blockIdx.y, blockIdx.z);
    } else {
      const unsigned wave = num_sms() * static_cast<unsigned>(Cfg::kCtasPerSm);
      const int64_t fit = kBudgetBytes / (static_cast<int64_t>(wave) * kCtaBytes);
      const unsigned per = fit < 1 ? 1u : (fit > 32 ? 32u : static_cast<unsigned>(fit));
      if (me >= wave) return;  // a later CTA: one of the first wave has asked for it
      const unsigned slot = me * per + lane;  // one CTA of the grid per lane
      if (lane >= per || slot >= ctas) return;
      const unsigned bx = slot % gx, by = (slot / gx) % gy, bz = slot / (gx * gy);
      const int e = guess_expert(p, tile_coords_of<Cfg::kRaster, Cfg::kClusterN>(bx, by).m_tile);
      if (e >= 0) prefetch_cta(p, e, bx, by, bz);
    }
  }
};

// The same knob on a main loop with warp-private rings (MmaDirect, Cfg::kDirect): every warp of
// every CTA, before griddep_wait, guesses its own CTA's expert (warp-uniform: lane 0's relaxed
// loads broadcast, or the contiguous family's warp-wide scan) and hands it with the CTA's tile and
// K range to Mainloop::early_copies, which copies the warp's first ring stages of that expert's
// words and scales (constant bytes) into shared memory. The routing is read again after the wait;
// a wrong guess costs bytes and a drain, never bits.
template <class Cfg, class Mainloop>
struct WarpRingPrefetch {
  __device__ __forceinline__ static void run(const GemmParams& p) {
    const TileCoords tc = tile_coords<Cfg::kRaster, Cfg::kClusterN>();
    const int lane = static_cast<int>(threadIdx.x % 32);
    int e = -1;
    if constexpr (Cfg::kFamily == Family::kContiguous) {
      e = contiguous_find<Cfg::kBlockM, true>(p, tc.m_tile, lane).expert;  // warp-uniform
    } else {
      if (lane == 0) e = FirstStagePrefetch<Cfg>::guess_expert(p, tc.m_tile);
      e = __shfl_sync(0xffffffffu, e, 0);
    }
    const KRange kr = split_k_range(p, Cfg::kSplitK > 1 ? static_cast<int>(blockIdx.z) : 0, Cfg::kSplitK);
    Mainloop::early_copies(p, e, tc.n_block * Cfg::kNTilesPerCta, kr.begin, kr.end);
  }
};

}  // namespace chord

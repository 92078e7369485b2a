// A W4A16 MoE GEMM kernel put together from its parts, for one configuration struct `Cfg` that
// chord.jit renders from a Schedule (one named constant per knob of chord.schedule.KNOBS:
// Cfg::kBlockM, Cfg::kSplitK, ...):
//   family (row source: indexed / grouped_contiguous / grouped_masked, moe/rows.cuh)
//   x main loop (mainloop/, one part each, chosen by MainloopFor: MmaSwap16, cp.async +
//     mma.sync; MmaDirect, the same MMAs fed by one cp.async ring per warp; MmaProducer, its tile
//     fed by a producer warp (bulk copies, mbarriers); WgmmaMultistage, cp.async + wgmma with a
//     CTA barrier per K block; WgmmaWarpSpecialized, a producer warpgroup and mbarriers; the two
//     wgmma loops share WgmmaTile)
//   x tile order (RASTER, moe/rows.cuh) x split-K (SPLIT, moe/epilogue.cuh)
//   x N tiles per CTA (NTILES) x epilogue fragment stores (STMATRIX, moe/epilogue.cuh)
//   x persistent CTAs (PERSISTENT: a grid of about one wave walks every tile, moe/rows.cuh
//     TileWalker; wgmma multistage ring)
//   x bulk copies (the wgmma loop's BULK_W / TMA_X; TMA_X kernels take the activations' tensor
//     map as a second __grid_constant__ parameter)
//   x split-K through a cluster (SPLIT_CLUSTER: __cluster_dims__(1, 1, SPLIT), the partials summed
//     through distributed shared memory, moe/epilogue.cuh)
//   x CTA pairs (CLUSTER_N = 2: the kernel is built with __cluster_dims__(1, 2, 1), and the two
//     CTAs of a cluster take neighbouring N blocks of one token tile, moe/rows.cuh tile_coords)
//   x programmatic dependent launch (PDL: launched with programmatic stream serialization, the
//     kernel waits for the previous grid before its first global read and lets the next one
//     launch, so the next GEMM's CTAs are resident when this one ends; chord.jit Kernel.launch)
//   x PDL that prefetches (PDL_PREFETCH: before the wait, about the first wave asks L2 for the
//     first ring of weights and scales of the grid's CTAs, moe/prefetch.cuh; with warp-private
//     rings each warp copies its own first stages into shared memory instead)
//   x stream-K (STREAMK, indexed family on the mma loop: about one wave of CTAs splits the valid
//     (tile, K block) units evenly, moe/stream_k.cuh)
//   x warp-private rings (the mma loop's direct = 1, MmaDirect: the CTA's warps split its K
//     range, each through its own cp.async ring with no CTA barrier, their partials summed once
//     before the epilogue).
// One CTA computes BT token rows x (NTILES x BN) output features of one expert, one BN-wide
// tile after the other through one continuous pipeline (the ring keeps loading the next tile's
// K blocks while a tile's epilogue runs; at short K, e.g. TP8 down with 4 K blocks, a one-tile
// CTA spends most of its life filling and draining the ring):
//   out[row, n] = sum_k x[row, k] * (q[e, n, k] * scale[e, n, k/32])
// This file only composes; chord/jit.py renders one instantiation per Schedule and
// static_asserts the shared-memory size and parameter offsets that Python computed.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/params.cuh"
#include "common/stamps.cuh"
#include "common/tma.cuh"
#include "mainloop/mma_direct.cuh"
#include "mainloop/mma_producer.cuh"
#include "mainloop/mma_swap16.cuh"
#include "mainloop/wgmma_multistage.cuh"
#include "mainloop/wgmma_warp_specialized.cuh"
#include "moe/epilogue.cuh"
#include "moe/prefetch.cuh"
#include "moe/rows.cuh"
#include "moe/stream_k.cuh"

namespace chord {

template <int A, int B>
struct MaxOf {
  static constexpr int value = A > B ? A : B;
};

// The main loop part a configuration names: mainloop mma -> MmaSwap16, MmaProducer with
// producer = 1, or MmaDirect with direct = 1; wgmma -> WgmmaMultistage, or WgmmaWarpSpecialized
// with producer = 1.
template <class Cfg>
struct MainloopFor {
  using type = std::conditional_t<
      Cfg::kMainloop == Mainloop::kMma,
      std::conditional_t<Cfg::kProducer, MmaProducer<Cfg>, std::conditional_t<Cfg::kDirect, MmaDirect<Cfg>, MmaSwap16<Cfg>>>,
      std::conditional_t<Cfg::kProducer, WgmmaWarpSpecialized<Cfg>, WgmmaMultistage<Cfg>>>;
};

// Whether a main loop reads the activations through a tensor map (WgmmaMultistage::kTmaX).
template <class M, class = void>
struct UsesTmaX : std::false_type {};
template <class M>
struct UsesTmaX<M, std::void_t<decltype(M::kTmaX)>> : std::bool_constant<M::kTmaX> {};

// Whether a main loop copies its first stages into shared memory before the PDL wait itself
// (MmaDirect::early_copies, moe/prefetch.cuh WarpRingPrefetch) rather than asking L2 for them.
template <class M, class = void>
struct HasEarlyCopies : std::false_type {};
template <class M>
struct HasEarlyCopies<M, std::void_t<decltype(M::kEarlyCopies)>> : std::bool_constant<M::kEarlyCopies> {};

template <class Cfg>
struct MoeKernel {
  static constexpr Family F = Cfg::kFamily;
  static constexpr int BT = Cfg::kBlockM;
  static constexpr int BN = Cfg::kBlockN;
  static constexpr int SPLIT = Cfg::kSplitK;
  static constexpr int RASTER = Cfg::kRaster;
  static constexpr int NTILES = Cfg::kNTilesPerCta;
  static constexpr bool STMATRIX = Cfg::kStmatrix;
  static constexpr int PERSISTENT = Cfg::kPersistent ? (Cfg::kQueue ? 2 : 1) : 0;
  static constexpr int CLUSTER_N = Cfg::kClusterN;
  static constexpr bool PDL = Cfg::kPdl;
  static constexpr bool PDL_PREFETCH = Cfg::kPdlPrefetch;
  static constexpr bool STREAMK = Cfg::kStreamK;
  static constexpr bool SPLIT_CLUSTER = Cfg::kSplitCluster;
  using Mainloop = typename MainloopFor<Cfg>::type;
  // PERSISTENT: 0 = one CTA per item; 1 = about one wave walks the items with a static stride;
  // 2 = the same walk with later items claimed from a work queue (moe/rows.cuh TileWalker DYNAMIC)
  static_assert(PERSISTENT >= 0 && PERSISTENT <= 2, "PERSISTENT is 0, 1 (static walk) or 2 (work queue)");
  static_assert(SPLIT >= 1, "SPLIT >= 1");
  static_assert(NTILES >= 1, "NTILES >= 1");
  static_assert(NTILES == 1 || SPLIT == 1, "NTILES > 1 needs SPLIT == 1 (split-K tiles are one per CTA)");
  static_assert(!PERSISTENT || SPLIT == 1, "PERSISTENT needs SPLIT == 1 (split-K tiles are one per CTA)");
  static_assert(!SPLIT_CLUSTER || (SPLIT >= 2 && SPLIT <= 8 && CLUSTER_N == 1 && !STREAMK &&
                                   Mainloop::kEpilogueThreads == Mainloop::kThreads),
                "SPLIT_CLUSTER: a 1 x 1 x SPLIT cluster (2-8 CTAs, no pairs) whose every thread runs the epilogue");
  static constexpr int kThreads = Mainloop::kThreads;
  // Dynamic shared memory, plus the slack that aligning the base to Mainloop::kAlign can cost
  // (the dynamic segment itself is 16-byte aligned). One tile per CTA: the pipeline or the
  // epilogue tile (the epilogue reuses the drained ring). Several: the ring, then the epilogue
  // tile after it (the ring is still loading the next tile while an epilogue runs).
  static constexpr bool kRingAndEpilogue = NTILES > 1 || PERSISTENT || STREAMK;
  static constexpr int kEpiOffset = kRingAndEpilogue ? Mainloop::kSmemBytes : 0;
  // SPLIT_CLUSTER: the epilogue's shared memory also holds the CTA's fp32 partial tile
  static constexpr int kEpiBytes = SPLIT_CLUSTER ? MaxOf<EpilogueConfig<BT, BN>::kSmemBytes, BT * BN * 4>::value
                                                 : EpilogueConfig<BT, BN>::kSmemBytes;
  static constexpr int kSmemBytes =
      (kRingAndEpilogue ? Mainloop::kSmemBytes + kEpiBytes : MaxOf<Mainloop::kSmemBytes, kEpiBytes>::value) +
      (Mainloop::kAlign > 128 ? Mainloop::kAlign - 16 : 0);
  static_assert(kEpiOffset % 16 == 0, "the epilogue tile is 16-byte aligned");

  static constexpr bool kTmaX = UsesTmaX<Mainloop>::value;
  static constexpr bool kEarlyCopies = HasEarlyCopies<Mainloop>::value;
  static_assert(!kTmaX || F != Family::kIndexed, "TMA_X: the indexed family gathers its rows (no tensor map)");
  static_assert(!kTmaX || !PERSISTENT, "TMA_X: one item per CTA");
  static_assert(CLUSTER_N == 1 || CLUSTER_N == 2, "CLUSTER_N is 1 or 2");
  static_assert(CLUSTER_N == 1 || !PERSISTENT, "CLUSTER_N: the launched grid's tiles (not persistent)");
  static_assert(!STREAMK || (F == Family::kIndexed && SPLIT == 1 && NTILES == 1 && !PERSISTENT && CLUSTER_N == 1 &&
                             RASTER == 0 && !kTmaX),
                "STREAMK: the indexed family, splitting the tile grid itself (no split-K, n_tiles, persistent, "
                "raster or pairs)");
  static_assert(!Cfg::kDirect || (NTILES == 1 && !PERSISTENT && !STREAMK),
                "direct main loop: one N block per CTA (no n_tiles, persistent walk or stream-K)");
  static_assert(!PDL_PREFETCH || (PDL && !PERSISTENT && !STREAMK),
                "PDL_PREFETCH: a PDL launch of one item per CTA (the launched grid's tiles)");

  // xmap: the activations' tensor map (TMA_X kernels only). A -DCHORD_STAMPS build records each
  // CTA's entry and exit here and its phases in the parts (common/stamps.cuh); otherwise the
  // stamps are empty statements.
  __device__ __forceinline__ static void run(const GemmParams& p, const TmaDescriptor* xmap = nullptr) {
    CHORD_STAMP_ENTRY();
    body(p, xmap);
    CHORD_STAMP_EXIT();
  }

  __device__ __forceinline__ static void body(const GemmParams& p, const TmaDescriptor* xmap) {
    if constexpr (PDL) {
      // Routing, activations, the split-K workspace and out may all be the previous kernel's
      // (moe_align, the activation, the GEMM before this one on the stream): wait for its grid
      // before the first global access; the parameter block is by value. Then let the next
      // kernel's CTAs launch into the SMs this grid's tail leaves idle (they wait in turn).
      // PDL_PREFETCH: first, the weights (never written by a kernel before this one) are asked for.
      if constexpr (PDL_PREFETCH && kEarlyCopies) {
        WarpRingPrefetch<Cfg, Mainloop>::run(p);  // every warp: its own ring's first stages
      } else if constexpr (PDL_PREFETCH) {
        if (threadIdx.x < 32) FirstStagePrefetch<Cfg>::run(p);
      }
      griddep_wait();
      CHORD_STAMP_CLOCK_T0(kStampWaitClk);
      griddep_launch_dependents();
    }
    extern __shared__ __align__(128) uint8_t smem_raw[];
    // token rows of the tile (persistent: of three tiles, moe/rows.cuh TileWalker)
    __shared__ int64_t in_rows[PERSISTENT ? 3 : 1][BT];
    __shared__ int64_t out_rows[PERSISTENT ? 3 : 1][BT];
    int64_t* in_row = in_rows[0];
    int64_t* out_row = out_rows[0];
    __shared__ int s_expert;
    __shared__ int64_t s_first;
    uint8_t* smem = smem_raw;
    if constexpr (Mainloop::kAlign > 128) {
      const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
      smem += (Mainloop::kAlign - (addr % Mainloop::kAlign)) % Mainloop::kAlign;
    }
    if constexpr (STREAMK) {
      const StreamKPlan<BT, BN> plan(p);
      if (plan.u0 >= plan.u1) return;  // uniform: fewer units than CTAs
      __shared__ StreamKRows<BT> sk_rows;
      typename Mainloop::Acc acc;
      auto epilogue = [&](int t, int seg_begin, int seg_end, int slot, const typename Mainloop::Acc& a) {
        CHORD_STAMP_MIN(kStampEpiClk);
        if (sk_rows.expert[slot] < 0) return;  // uniform: a block without a local expert stores nothing
        store_stream_k<BT, BN, kThreads, Mainloop::kMmaWarps, Mainloop::kNTW, Mainloop::kSwapped, STMATRIX>(
            p, plan, a, t, seg_begin, seg_end, sk_rows.out_row[slot], smem + kEpiOffset);
      };
      StreamKRowSource<BT, kThreads> rows(sk_rows);  // the routing walk (moe/stream_k.cuh)
      static_assert(decltype(rows)::kXIters == Mainloop::kXIters, "stream-K: the row source follows the copy plan");
      Mainloop::run_stream(p, plan, rows, smem, acc, epilogue);
      return;
    }
    if constexpr (PERSISTENT) {
      using Walker = TileWalker<F, BT, BN * NTILES, RASTER, kThreads, PERSISTENT == 2>;  // an item: NTILES N blocks
      __shared__ int s_tile_expert[Walker::kBuffers];
      __shared__ int s_tile_nblock[Walker::kBuffers];
      __shared__ int s_claim;
      Walker walker(p, in_rows, out_rows, s_tile_expert, s_tile_nblock, &s_expert, &s_first, &s_claim);
      const bool any = walker.commit(p, 0);
      __syncthreads();  // publishes tile 0's rows
      if (!any) return;  // uniform: this CTA has no tile
      typename Mainloop::Acc acc;
      auto epilogue = [&](int t, const typename Mainloop::Acc& a) {
        CHORD_STAMP_MIN(kStampEpiClk);
        constexpr int kEpi = Mainloop::kEpilogueThreads;
        const int b = (t / NTILES) % Walker::kBuffers;
        store_tile<BT, BN, kEpi, Mainloop::kMmaWarps, Mainloop::kNTW, 1, kEpi == kThreads, Mainloop::kSwapped,
                   STMATRIX>(p, a, walker.n_block(b) * NTILES + t % NTILES, walker.out_rows(b), smem + kEpiOffset);
      };
      Mainloop::template run<NTILES>(p, walker.expert(0), walker.n_block(0) * NTILES, walker.in_rows(0), 0,
                                static_cast<int>(p.k) / kKBlock, smem, acc, epilogue, &walker);
      return;
    }
    const TileCoords tc = tile_coords<RASTER, CLUSTER_N>();
    int e;
    if constexpr (F == Family::kIndexed) {
      e = rows_indexed<BT>(p, tc.m_tile, in_row, out_row);
    } else if constexpr (F == Family::kMasked) {
      e = rows_masked<BT>(p, tc.m_tile, in_row, out_row);
    } else {
      e = rows_contiguous<BT>(p, tc.m_tile, in_row, out_row, &s_expert, &s_first);
    }
    if (e < 0) {  // uniform across the CTA
      if constexpr (PDL_PREFETCH && kEarlyCopies) cp_async_wait<0>();  // a guess's copies land before the CTA leaves
      return;
    }
    __syncthreads();
    CHORD_STAMP_CLOCK_T0(kStampRowsClk);

    const KRange kr = split_k_range(p, SPLIT > 1 ? static_cast<int>(blockIdx.z) : 0, SPLIT);
    const int kb_begin = kr.begin, kb_end = kr.end;
    typename Mainloop::Acc acc;
    // The main loop calls this once per finished tile t (n block tc.n_block * NTILES + t), from
    // the threads that hold accumulators (a producer warpgroup has left by then).
    auto epilogue = [&](int t, const typename Mainloop::Acc& a) {
      CHORD_STAMP_MIN(kStampEpiClk);
      constexpr int kEpi = Mainloop::kEpilogueThreads;
      store_tile<BT, BN, kEpi, Mainloop::kMmaWarps, Mainloop::kNTW, SPLIT, kEpi == kThreads, Mainloop::kSwapped,
                 STMATRIX, SPLIT_CLUSTER>(p, a, tc.n_block * NTILES + t, out_row, smem + kEpiOffset);
    };
    if constexpr (kTmaX) {
      Mainloop::template run<NTILES>(p, e, tc.n_block * NTILES, in_row, kb_begin, kb_end, smem, acc, epilogue,
                                     static_cast<NoWalker*>(nullptr), xmap);
    } else {
      Mainloop::template run<NTILES>(p, e, tc.n_block * NTILES, in_row, kb_begin, kb_end, smem, acc, epilogue);
    }
  }
};

}  // namespace chord

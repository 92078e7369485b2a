// Main loop `mma`, warp-specialized (producer = 1): the MmaSwap16 tile (the same stage layout,
// the same compute_stage / compute_stage_folded, so the same MMAs in the same order and
// bit-identical outputs) fed by one producer warp through an mbarrier ring instead of every
// thread's cp.async copies and a CTA barrier per K block.
//
// The producer warp (the CTA's last warp) fills slot g % STAGES with K block g: lane 0 announces
// the stage's weight and scale bytes on the slot's `full` mbarrier and moves them with the copy
// engine (a CTA's N block is BN / 128 tile groups of 8, common/params.cuh Swap16Layout: K block kb
// of one group is one contiguous 4 KB run of swap16 words and one 512-byte run of scales, copied
// with cp.async.bulk and an evict-first L2 hint: decode reads each weight once); the warp's 32
// lanes gather the BT activation rows with 16-byte cp.async copies into the XOR-swizzled rows
// compute_stage reads (a padding row is zero-filled), and each lane's copies arrive on the same
// barrier when they land (cp.async.mbarrier.arrive.noinc). The slot's phase completes when all
// 32 lanes and lane 0's announcement have arrived and the announced bytes have landed.
//
// The MMA warps wait on `full` for each stage (never on a copy group or a CTA barrier), run its
// MMAs and hand the slot back on its `empty` mbarrier (every MMA thread arrives, after its own
// reads of the slot); the producer waits on `empty` before refilling a slot, so up to STAGES K
// blocks are in flight per CTA while the MMA warps compute. One N block per CTA (no n_tiles, no
// stream-K); split-K ranges are walked as any range.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "../common/mbarrier.cuh"
#include "../common/params.cuh"
#include "../common/ptx.cuh"
#include "../common/stamps.cuh"
#include "../common/tma.cuh"
#include "mma_swap16.cuh"

namespace chord {

// Cfg: the schedule's configuration struct (chord.jit.render_config); the tile's knobs are
// MmaSwap16's (block_m, block_n, warps, stages, swap, fold); producer = 1 selects this loop.
template <class Cfg>
struct MmaProducer {
  using Tile = MmaSwap16<Cfg>;
  static constexpr int BT = Tile::BT;
  static constexpr int BN = Tile::BN;
  static constexpr int STAGES = Tile::STAGES;
  static constexpr bool kSwapped = Tile::kSwapped;
  static constexpr int kMmaWarps = Tile::kMmaWarps;
  static constexpr int kNTiles = Tile::kNTiles;
  static constexpr int kNTW = Tile::kNTW;
  static constexpr int kWBytes = Tile::kWBytes;
  static constexpr int kSBytes = Tile::kSBytes;
  static constexpr int kStageBytes = Tile::kStageBytes;
  static constexpr int kSmemBytes = Tile::kSmemBytes;
  static constexpr int kAlign = Tile::kAlign;
  static constexpr int kThreads = kMmaWarps * 32 + 32;        // the MMA warps, then the producer warp
  static constexpr int kEpilogueThreads = kMmaWarps * 32;     // the producer warp has left by then
  static constexpr int kGroups = BN / 128;                    // tile groups of 8 per N block
  static constexpr uint32_t kTxBytes = kWBytes + kSBytes;     // the copy engine's bytes per stage
  static constexpr int kXChunks = BT * 8;                     // 16-byte activation chunks per stage
  static constexpr int kXIters = (kXChunks + 31) / 32;        // per producer lane
  static_assert(BN % 128 == 0 && Swap16Layout<kNTiles>::kFixed,
                "mma producer loop: whole tile groups of 8 (BN % 128 == 0, the default tile group cap)");
  static_assert(kWBytes == kGroups * 4096 && kSBytes == kGroups * 512, "mma producer loop: one run per group");
  static_assert(STAGES >= 2, "mma producer loop: STAGES >= 2");
  using Acc = typename Tile::Acc;

  // Accumulates K blocks [kb_begin, kb_end) of N block `n_block` of expert `expert` and calls
  // epilogue(0, acc) from the MMA warps (the producer warp returns without calling it).
  template <int NTILES, class Epilogue, class Walker = NoWalker>
  __device__ __forceinline__ static void run(const GemmParams& p, int expert, int n_block,
                                             const int64_t* __restrict__ in_row, int kb_begin, int kb_end,
                                             uint8_t* smem, Acc& acc, Epilogue&& epilogue) {
    static_assert(NTILES == 1, "mma producer loop: one N block per CTA");
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int KB = kb_end - kb_begin;
    const uint32_t smem_base = smem_u32(smem);
    __shared__ __align__(8) uint64_t full[STAGES];
    __shared__ __align__(8) uint64_t empty[STAGES];
    // full: 32 lanes' cp.async arrivals + lane 0's announcement; empty: every MMA thread
    mbar_init_ring(full, empty, 33, kMmaWarps * 32);

    if (warp == kMmaWarps) {  // the producer warp
      const uint64_t evict_first = make_evict_first_policy();
      const Swap16Layout<kNTiles> lay(p, expert);
      const int t0 = n_block * kNTiles;
      // this lane's activation chunks: sources at K block kb_begin, swizzled destinations
      const __nv_bfloat16* xsrc[kXIters];
      uint32_t xdst[kXIters];
      bool xvalid[kXIters];
#pragma unroll
      for (int it = 0; it < kXIters; ++it) {
        const int c = lane + it * 32;
        const int r = (c / 8) % BT, ch = c % 8;
        const int64_t row = in_row[r];
        xvalid[it] = row >= 0 && c < kXChunks;
        xsrc[it] = p.x + (row >= 0 ? row * p.k + static_cast<int64_t>(kb_begin) * kKBlock + ch * 8 : 0);
        xdst[it] = Tile::x_offset(r, ch);
      }
      for (int g = 0; g < KB; ++g) {
        const int slot = g % STAGES;
        if (g >= STAGES) mbar_wait(&empty[slot], ((g / STAGES) - 1) & 1);
        const uint32_t st = smem_base + slot * kStageBytes;
        const uint32_t bar = smem_u32(&full[slot]);
        if (lane == 0) {
          mbar_arrive_expect_tx(&full[slot], kTxBytes);
#pragma unroll
          for (int j = 0; j < kGroups; ++j) {
            const int64_t b = lay.block(t0 + 8 * j, kb_begin + g);
            bulk_copy_g2s_stream(st + j * 4096, p.qweight + b * 32, 4096, bar, evict_first);
            bulk_copy_g2s_stream(st + kWBytes + j * 512, p.scales + b * 8, 512, bar, evict_first);
          }
        }
#pragma unroll
        for (int it = 0; it < kXIters; ++it) {
          if (kXChunks % 32 == 0 || lane + it * 32 < kXChunks)
            cp_async_16_u32(st + xdst[it], xsrc[it] + static_cast<int64_t>(g) * kKBlock, xvalid[it]);
        }
        cp_async_mbar_arrive_noinc(&full[slot]);
      }
      cp_async_wait<0>();  // this warp's copies have landed before it leaves
      return;
    }

    // the MMA warps
    zero_acc(acc);
    for (int g = 0; g < KB; ++g) {
      const int slot = g % STAGES;
      mbar_wait(&full[slot], (g / STAGES) & 1);
      if (g == 0) CHORD_STAMP_MIN(kStampFirstClk);
      if constexpr (Cfg::kFold) {
        Tile::compute_stage_folded(smem + slot * kStageBytes, acc);
      } else {
        Tile::compute_stage(smem + slot * kStageBytes, acc);
      }
      // after this thread's reads of the slot (release): the producer may refill it
      if (g + STAGES < KB) mbar_arrive(&empty[slot]);
    }
    epilogue_sync<kEpilogueThreads, false>();  // every MMA warp is done reading the ring
    epilogue(0, acc);
  }
};

}  // namespace chord

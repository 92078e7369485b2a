// The wgmma tile (sm_90a): what the two wgmma main loops share, the operand swap at warpgroup
// scale and one K block's dequantization and MMAs. The loops around it are parts of their own:
// wgmma_multistage.cuh (every thread copies, a CTA barrier per K block: the loop the profiles
// select) and wgmma_warp_specialized.cuh (a producer warpgroup feeding an mbarrier ring).
//
// Each warp owns NTW = BN/16/WARPS 16-row weight tiles (tiles warp*NTW + j); the j-th tiles of
// a warpgroup's four warps are the 64-row A operand of its j-th `wgmma.mma_async.m64n{BT}k16`,
// dequantized int4 -> bf16 in registers straight from the swap16 words (a warp's 16 rows of a
// wgmma A fragment have the per-lane arrangement of the mma.m16n8k16 A fragment, which is what a
// swap16 word holds). NTW = 2 or 4 ("wide warp tiles") puts 128 or 256 weight rows on one
// warpgroup, e.g. 192 tokens x 256 features or 32 tokens x 512 features on 8 warps: each token
// row is read by fewer CTAs and each CTA moves more MACs per barrier. The BT token rows are the
// N side, read by the tensor cores from shared memory through a matrix descriptor: each 64-wide
// K block of a token row is one 128-byte row with the 128-byte swizzle, exactly the XOR swizzle
// the cp.async gather writes.
//
// By default the copies carry no L2 eviction hint: at prefill a weight tile is read by every
// token tile of its raster group, so it should stay in L2. The multistage loop's l2_hint knob
// reads the activation rows evict-last (and, at 1, the weights evict-first) where tokens are
// gathered by many experts. (With a hint, ptxas 13.0 once put the 64-bit policy of the BN=64
// kernels in an odd uniform register, which faulted as an illegal instruction on the H200;
// chord.jit reads every built kernel's SASS for that and rebuilds it without hints.)
//
// Pipeline: a STAGES-deep cp.async ring of [activations | swap16 words | scales] per 64-wide K
// block. Per K block a warp reads its words and scales and issues 4 / GS wgmma groups: each
// dequantizes GS k16 steps of its NTW tiles into one of two register sets and issues their
// NTW x GS wgmmas as one group. GS = 4 (one group per block; the sets alternate per block) needs
// 32 x NTW A registers; GS = 1 or 2 (the sets alternate inside a block) 8 or 16 x NTW, which is
// what leaves room for the wide tiles' 2-4x accumulators. After each group a warp waits until
// at most WAIT groups are in flight. WAIT = 1 (batched `wait_group 1`): the tensor cores run one
// group while the warps dequantize the next; a ring slot is refilled two blocks after it was
// read, once the groups that read it have retired in every warp (a CTA barrier lies between).
// WAIT = 0 retires each group before the next dequantization. Every GS and WAIT issues the
// same MMAs in the same order, so their outputs are bit-identical.

#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>

#include "../common/dequant.cuh"
#include "../common/params.cuh"
#include "../common/ptx.cuh"
#include "../common/wgmma.cuh"

namespace chord {

// Cfg: the schedule's configuration struct (chord.jit.render_config); the tile reads block_m,
// block_n, stages, wgmma_wait, warps and group_steps.
// What a main loop built on WgmmaTile<Cfg> (a dependent base, whose members unqualified lookup
// does not find) names unqualified: one list for both wgmma loops.
#define CHORD_WGMMA_TILE_NAMES \
  using Tile = WgmmaTile<Cfg>; \
  using Tile::BT; \
  using Tile::BN; \
  using Tile::STAGES; \
  using Tile::WARPS; \
  using Tile::WAIT; \
  using Tile::GS; \
  using Tile::kMmaWarps; \
  using Tile::kNTiles; \
  using Tile::kNTW; \
  using Tile::kXBytes; \
  using Tile::kWBytes; \
  using Tile::kSBytes; \
  using Tile::kStageBytes; \
  using typename Tile::Acc; \
  using Tile::fence_acc; \
  using Tile::k_loop; \
  using Tile::mma_block; \
  using Tile::retire

template <class Cfg>
struct WgmmaTile {
  static constexpr int BT = Cfg::kBlockM;
  static constexpr int BN = Cfg::kBlockN;
  static constexpr int STAGES = Cfg::kStages;
  static constexpr int WAIT = Cfg::kWgmmaWait;
  static constexpr int WARPS = Cfg::kWarps;
  static constexpr int GS = Cfg::kGroupSteps;
  static_assert(BT % 8 == 0 && BT >= 8 && BT <= 256, "wgmma main loop: BT multiple of 8 in [8, 256]");
  static_assert(BN % 64 == 0 && BN >= 64 && BN <= 512, "wgmma main loop: BN a multiple of 64 in [64, 512]");
  static_assert(WARPS % 4 == 0 && WARPS >= 4 && WARPS <= 16 && BN % (16 * WARPS) == 0,
                "wgmma main loop: WARPS whole warpgroups (4, 8, 12, 16), each warp a whole number of 16-row tiles");
  static_assert(BN / 16 / WARPS == 1 || BN / 16 / WARPS == 2 || BN / 16 / WARPS == 4,
                "wgmma main loop: 1, 2 or 4 weight tiles per warp (NTW)");
  static_assert(STAGES >= 3, "wgmma main loop: STAGES >= 3 (one slot is read by the group in flight)");
  static_assert(WAIT == 0 || WAIT == 1, "wgmma main loop: WAIT is 0 or 1");
  static_assert(GS == 1 || GS == 2 || GS == 4, "wgmma main loop: GS (k16 steps per wgmma group) is 1, 2 or 4");
  static constexpr int kMmaWarps = WARPS;
  static constexpr int kEpilogueThreads = kMmaWarps * 32;  // the producer warpgroup leaves first
  static constexpr bool kSwapped = true;  // weights on the M side (the accumulator layout of moe/epilogue.cuh)
  static constexpr int kNTiles = BN / 16;
  static constexpr int kNTW = kNTiles / WARPS;  // 16-row weight tiles per warp
  static constexpr int kTT = BT / 8;
  static constexpr int kXBytes = BT * kKBlock * 2;   // 1024-aligned: BT % 8 == 0
  static constexpr int kWBytes = kNTiles * 32 * 16;  // swap16 words per stage
  static constexpr int kSBytes = kNTiles * 8 * 8;    // scales per stage
  static constexpr int kStageBytes = (kXBytes + kWBytes + kSBytes + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = STAGES * kStageBytes;
  static constexpr int kAlign = 1024;  // the 128-byte swizzle repeats every 1024 bytes

  using Acc = float[kNTW][kTT][4];

  // Register set of the dequantized A operand of one group: GS k16 steps x NTW tiles.
  using Regs = uint32_t[GS][kNTW][4];

  // The consumer half of one K block: this warp's swap16 words and scales of ring slot `slot`,
  // dequantized group by group (GS k16 steps each, NTW tiles per step) and issued as NTW x GS
  // wgmmas per committed group. GS = 4: one group per block in register set `a[0]` (the sets
  // alternate per block, k_loop). GS < 4: 4 / GS groups, alternating between a[0] and a[1]
  // (every block starts on a[0] and leaves its last group, on a[1], in flight, the same at every
  // loop join), each followed by a wait until at most WAIT groups are in flight: the set of
  // group g-1 is free again for group g+1 once group g-1 has retired.
  template <int NSETS>
  __device__ __forceinline__ static void mma_block(const uint8_t* smem, uint64_t desc0, int slot, int warp, int lane,
                                                   Regs (&a)[NSETS], Acc& acc) {
    static_assert((GS == 4) == (NSETS == 1), "one register set per block (GS = 4) or a pair (GS < 4)");
    const uint8_t* st = smem + slot * kStageBytes;
    uint4 words[kNTW];
    uint2 scl[kNTW];
#pragma unroll
    for (int j = 0; j < kNTW; ++j) {
      words[j] = reinterpret_cast<const uint4*>(st + kXBytes)[(warp * kNTW + j) * 32 + lane];
      scl[j] = reinterpret_cast<const uint2*>(st + kXBytes + kWBytes)[(warp * kNTW + j) * 8 + lane / 4];
    }
    const uint64_t desc = desc0 + static_cast<uint64_t>((slot * kStageBytes) >> 4);
#pragma unroll
    for (int h = 0; h < 4 / GS; ++h) {
      Regs& r = a[h % NSETS];
#pragma unroll
      for (int u = 0; u < GS; ++u) {
        const int s = h * GS + u;  // k16 step; word component s, one scale per 32 K (two steps)
#pragma unroll
        for (int j = 0; j < kNTW; ++j) {
          const __nv_bfloat162 sp = as_bf162(s < 2 ? scl[j].x : scl[j].y);
          const uint32_t w = s == 0 ? words[j].x : s == 1 ? words[j].y : s == 2 ? words[j].z : words[j].w;
          dequant_swap16(w, __low2bfloat162(sp), __high2bfloat162(sp), r[u][j]);
        }
      }
      wgmma_fence();
#pragma unroll
      for (int u = 0; u < GS; ++u)
#pragma unroll
        for (int j = 0; j < kNTW; ++j)
          WgmmaRA<BT>::mma(acc[j], r[u][j], desc + static_cast<uint64_t>((h * GS + u) * 2), 1);
      wgmma_commit();
      if constexpr (GS < 4) wgmma_wait<WAIT>();  // no accumulator access here: a group may still be in flight
    }
  }

  // The activation half of a stage's copy plan, for a thread `t` of `NTHREADS` copying threads:
  // its 16-byte chunks c = t + it * NTHREADS (row c / 8 of the tile, chunk c % 8 of the row's
  // 64-wide K block) get their sources at K block 0 of `xbase` (rows[r] < 0, a padding row: skip
  // 1, zero-filled), and all share the destination offset x_dst(t) + it * NTHREADS * 16 (the
  // 128-byte XOR swizzle's phase repeats every 8 rows, NTHREADS % 64 == 0). Computed once per
  // tile; each K block only advances the sources by kKBlock.
  template <int NTHREADS>
  static constexpr int kXIters = (BT * 8 + NTHREADS - 1) / NTHREADS;
  template <int NTHREADS>
  __device__ __forceinline__ static void aim_x(const int64_t* __restrict__ rows, const __nv_bfloat16* xbase,
                                               int64_t k, int t, const __nv_bfloat16* (&xsrc)[kXIters<NTHREADS>],
                                               uint32_t (&xskip)[kXIters<NTHREADS>]) {
    static_assert(NTHREADS % 64 == 0, "wgmma copy plan: a thread's activation chunks share their swizzle phase");
    constexpr int kChunks = BT * 8;
#pragma unroll
    for (int it = 0; it < kXIters<NTHREADS>; ++it) {
      const int c = t + it * NTHREADS;
      const int64_t row = (kChunks % NTHREADS == 0 || c < kChunks) ? rows[c / 8] : -1;
      xsrc[it] = xbase + (row >= 0 ? row * k + (c % 8) * 8 : 0);
      xskip[it] = row >= 0 ? 0u : 1u;
    }
  }
  __device__ __forceinline__ static uint32_t x_dst(int t) { return (t / 8) * 128 + (((t % 8) ^ ((t / 8) & 7)) * 16); }

  // Keeps the compiler from moving accumulator accesses across the wgmma fences and waits.
  __device__ __forceinline__ static void fence_acc(Acc& acc) {
#pragma unroll
    for (int j = 0; j < kNTW; ++j) wgmma_fence_operand(acc[j]);
  }

  // Runs `block(kb, a, drain)` over kb = 0..KB-1. GS = 4: the two register sets alternate per
  // block; an odd count starts with a lone block that retires its group before the loop (ptxas
  // must never see a group in flight where two paths join). GS < 4: one pair of sets, which
  // alternate inside each block (mma_block).
  template <class Block>
  __device__ __forceinline__ static void k_loop(int KB, Block&& block) {
    if constexpr (GS == 4) {
      Regs a0[1], a1[1];
      int kb = 0;
      if (KB & 1) block(kb++, a1, std::true_type{});
      for (; kb < KB; kb += 2) {
        block(kb, a0, std::false_type{});
        block(kb + 1, a1, std::false_type{});
      }
    } else {
      Regs a[2];
      for (int kb = 0; kb < KB; ++kb) block(kb, a, std::false_type{});
    }
  }

  // wait_group after block kb: everything on the last block (the epilogue reads acc next).
  // GS < 4: mma_block has waited after each group already.
  template <class Drain>
  __device__ __forceinline__ static void retire(int kb, int KB, Drain) {
    if (Drain::value || kb + 1 == KB) {
      wgmma_wait<0>();
    } else if constexpr (GS == 4) {
      wgmma_wait<WAIT>();  // no accumulator access here: a group may still be in flight
    }
  }
};

}  // namespace chord

// Main loop `wgmma`: the operand swap at warpgroup scale (sm_90a).
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
// Weights are loaded without an L2 eviction hint: at prefill a weight tile is read by every token
// tile of its raster group, so it should stay in L2. (With the hint, ptxas 13.0 put the 64-bit
// policy of the BN=64 kernels in an odd uniform register, which faulted as an illegal
// instruction on the H200.)
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
//
// PRODUCER = 0 (multistage): every thread issues its share of the cp.async copies and a CTA
// barrier per K block publishes a stage. PRODUCER = 1 (warp-specialized): an extra warpgroup
// issues all copies, with its registers handed to the consumers (setmaxnreg 88 / the rest); it
// publishes a stage on the stage's `full` mbarrier once its cp.async group has landed
// (wait_group + proxy fence + arrive), and the consumer threads hand the slot back on its
// `empty` mbarrier (each one arrives) when the wgmma group that read it has retired. Consumers
// never wait for each other, only for data. The MMAs and their order are the same in both (bit-identical outputs).
//
// Bulk copies (multistage only, one CTA per item): BULK_W = 1 moves a stage's swap16 words and
// scales with the copy engine instead of every thread's cp.async: a CTA's N block is BN / 128
// tile groups of 8 (common/params.cuh, Swap16Layout), and K block kb of one group is one
// contiguous 4 KB run of words and one 512-byte run of scales, so thread 0 issues 2 x BN / 128
// cp.async.bulk copies per stage. TMA_X = 1 (grouped families, whose tile rows are consecutive
// rows of x) moves the BT x 64 activation box with one cp.async.bulk.tensor through the
// host's tensor map (128-byte swizzle: the same bytes the cp.async gather writes; rows past
// x's end arrive as zeros, rows of the next expert are read but only feed output columns the
// epilogue never stores). Both complete on the slot's mbarrier (expect_tx by thread 0), which
// every thread waits on after the stage's CTA barrier; the barrier still orders the refill of
// a slot after the wgmma groups that read it. Same bytes in shared memory, same MMAs: the
// outputs are bit-identical to BULK_W = TMA_X = 0.

#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>

#include "../common/dequant.cuh"
#include "../common/mbarrier.cuh"
#include "../common/params.cuh"
#include "../common/ptx.cuh"
#include "../common/tma.cuh"
#include "../common/wgmma.cuh"
#include "../moe/epilogue.cuh"

namespace chord {

template <int BT, int BN, int STAGES, int WAIT, int PRODUCER = 0, int WARPS = BN / 16, int GS = 4, int BULK_W = 0,
          int TMA_X = 0>
struct WgmmaSwap64 {
  static_assert(BT % 8 == 0 && BT >= 8 && BT <= 256, "wgmma main loop: BT multiple of 8 in [8, 256]");
  static_assert(BN % 64 == 0 && BN >= 64 && BN <= 512, "wgmma main loop: BN a multiple of 64 in [64, 512]");
  static_assert(WARPS % 4 == 0 && WARPS >= 4 && WARPS <= 16 && BN % (16 * WARPS) == 0,
                "wgmma main loop: WARPS whole warpgroups (4, 8, 12, 16), each warp a whole number of 16-row tiles");
  static_assert(BN / 16 / WARPS == 1 || BN / 16 / WARPS == 2 || BN / 16 / WARPS == 4,
                "wgmma main loop: 1, 2 or 4 weight tiles per warp (NTW)");
  static_assert(STAGES >= 3, "wgmma main loop: STAGES >= 3 (one slot is read by the group in flight)");
  static_assert(WAIT == 0 || WAIT == 1, "wgmma main loop: WAIT is 0 or 1");
  static_assert(PRODUCER == 0 || PRODUCER == 1, "wgmma main loop: PRODUCER is 0 or 1");
  static_assert(GS == 1 || GS == 2 || GS == 4, "wgmma main loop: GS (k16 steps per wgmma group) is 1, 2 or 4");
  static_assert((BULK_W == 0 && TMA_X == 0) || PRODUCER == 0, "wgmma main loop: BULK_W / TMA_X need the multistage ring");
  static_assert(BULK_W == 0 || (BN % 128 == 0 && Swap16Layout<BN / 16>::kFixed),
                "wgmma main loop: BULK_W needs whole tile groups of 8 (BN % 128 == 0, the default tile group cap)");
  static constexpr int kMmaWarps = WARPS;
  static constexpr int kThreads = kMmaWarps * 32 + (PRODUCER ? 128 : 0);
  static constexpr int kEpilogueThreads = kMmaWarps * 32;  // the producer warpgroup leaves first
  static constexpr bool kSwapped = true;  // weights on the M side (the accumulator layout of moe/epilogue.cuh)
  // PRODUCER = 1: the producer warpgroup gives registers to the consumers (setmaxnreg). The CTA
  // starts with kEntryRegs per thread (ptxas' cap for __launch_bounds__(kThreads, 1)); the
  // consumers may take only what the producer gives back, else setmaxnreg.inc would wait forever.
  static constexpr int kProducerRegs = 88;
  static constexpr int kEntryRegsRaw = 65536 / kThreads / 8 * 8;
  static constexpr int kEntryRegs = kEntryRegsRaw > 256 ? 256 : kEntryRegsRaw;
  static constexpr int kConsumerRegsRaw =
      (kEntryRegs + 128 * (kEntryRegs - kProducerRegs) / (kMmaWarps * 32)) / 8 * 8;
  static constexpr int kConsumerRegs = kConsumerRegsRaw > 256 ? 256 : kConsumerRegsRaw;
  static_assert(!PRODUCER || kConsumerRegs > kEntryRegs,
                "wgmma main loop: the producer warpgroup has no registers to hand over at this tile (BN <= 192)");
  static_assert(!PRODUCER || kMmaWarps * 32 * (kConsumerRegs - kEntryRegs) <= 128 * (kEntryRegs - kProducerRegs),
                "wgmma main loop: consumers would take more registers than the producer gives back");
  static constexpr int kNTiles = BN / 16;
  static constexpr int kNTW = kNTiles / WARPS;  // 16-row weight tiles per warp
  static constexpr int kTT = BT / 8;
  static constexpr int kXBytes = BT * kKBlock * 2;   // 1024-aligned: BT % 8 == 0
  static constexpr int kWBytes = kNTiles * 32 * 16;  // swap16 words per stage
  static constexpr int kSBytes = kNTiles * 8 * 8;    // scales per stage
  static constexpr int kStageBytes = (kXBytes + kWBytes + kSBytes + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = STAGES * kStageBytes;
  static constexpr int kAlign = 1024;  // the 128-byte swizzle repeats every 1024 bytes
  // PRODUCER = 1: stages whose copies may still be in flight before the producer publishes the
  // oldest (<= STAGES - 2, so the producer never waits for a slot it has not published yet).
  static constexpr int kLag = STAGES - 2;
  static constexpr bool kBulkW = BULK_W != 0;
  static constexpr bool kTmaX = TMA_X != 0;  // run() takes the activation tensor map
  static constexpr bool kBulk = kBulkW || kTmaX;
  // Multistage: K blocks loaded ahead of the one the MMAs read (block g + kDist is loaded at block
  // g, into the slot block g + kDist - STAGES left, whose wgmma group has retired in every warp;
  // one slot is read by the group in flight).
  static constexpr int kDist = STAGES - 2;
  static constexpr int kGroups = BN / 128;  // BULK_W: tile groups of 8 per N block
  // bytes the copy engine completes on a slot's mbarrier per stage
  static constexpr uint32_t kTxBytes = (kBulkW ? kWBytes + kSBytes : 0) + (kTmaX ? kXBytes : 0);

  using Acc = float[kNTW][kTT][4];

  // Copies of K block kb (relative to the tile's first block) into ring slot `slot`, shared out
  // over `nthreads` threads of which this is thread `t`.
  template <int NTHREADS>
  __device__ __forceinline__ static void load_stage(const GemmParams& p, const int64_t* __restrict__ in_row,
                                                    const __nv_bfloat16* xbase, const Swap16Layout<kNTiles>& lay,
                                                    int t0, int kb0, int t, uint32_t st, int kb) {
    constexpr int kXChunks = BT * 8, kWChunks = kNTiles * 32, kSChunks = kNTiles * 4;
    const int K = lay.kb_all * kKBlock;
#pragma unroll
    for (int it = 0; it < (kXChunks + NTHREADS - 1) / NTHREADS; ++it) {
      const int c = t + it * NTHREADS;
      if (kXChunks % NTHREADS == 0 || c < kXChunks) {
        const int r = c / 8, ch = c % 8;
        const int64_t row = in_row[r];
        const __nv_bfloat16* src = xbase + (row >= 0 ? row * K + kb * kKBlock + ch * 8 : 0);
        cp_async_16_u32(st + r * 128 + ((ch ^ (r & 7)) * 16), src, row >= 0);
      }
    }
#pragma unroll
    for (int it = 0; it < (kWChunks + NTHREADS - 1) / NTHREADS; ++it) {
      const int c = t + it * NTHREADS;
      if (kWChunks % NTHREADS == 0 || c < kWChunks)
        cp_async_16_u32(st + kXBytes + c * 16, p.qweight + lay.block(t0 + c / 32, kb0 + kb) * 32 + c % 32, true);
    }
#pragma unroll
    for (int it = 0; it < (kSChunks + NTHREADS - 1) / NTHREADS; ++it) {
      const int c = t + it * NTHREADS;
      if (kSChunks % NTHREADS == 0 || c < kSChunks)
        cp_async_16_u32(st + kXBytes + kWBytes + c * 16,
                        reinterpret_cast<const uint8_t*>(p.scales + lay.block(t0 + c / 4, kb0 + kb) * 8) + (c % 4) * 16,
                        true);
    }
  }

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

  // Accumulates K blocks [kb_begin, kb_end) of NTILES consecutive N blocks from `n_block` and
  // calls epilogue(t, acc) after tile t (see MmaSwap16::run; NTILES > 1: multistage only). The
  // producer warpgroup returns without calling it: the consumers alone run the epilogue (its
  // code never joins the producer's, whose registers were given away).
  //
  // Persistent (`walker` given; multistage only): after this first item (NTILES N blocks of one
  // token tile) the CTA goes on with the items walker->commit(buf) resolves (moe/rows.cuh,
  // TileWalker: expert, N item and rows of the CTA's item i in row buffer i % 3), through the
  // same continuous ring: item 1 is resolved before the ring starts, item i + 2 at the end of
  // item i (its routing loads were issued an item earlier), before the ring reaches it. The ring
  // runs at most one tile ahead: K / 64 >= STAGES - 2 (checked on the host, chord.ops).
  // epilogue(t, acc) is called after the CTA's t-th tile.
  template <int NTILES, class Epilogue, class Walker = NoWalker>
  __device__ __forceinline__ static void run(const GemmParams& p, int expert, int n_block,
                                             const int64_t* __restrict__ in_row, int kb_begin, int kb_end,
                                             uint8_t* smem, Acc& acc, Epilogue&& epilogue, Walker* walker = nullptr,
                                             const TmaDescriptor* xmap = nullptr) {
    constexpr bool kPersist = !std::is_same<Walker, NoWalker>::value;
    static_assert(!kPersist || !kBulk, "wgmma main loop: BULK_W / TMA_X walk one item per CTA (not persistent)");
    static_assert(NTILES == 1 || PRODUCER == 0, "wgmma main loop: NTILES > 1 needs PRODUCER == 0");
    static_assert(!kPersist || PRODUCER == 0, "wgmma main loop: persistent CTAs need the multistage ring");
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int KB = kb_end - kb_begin;
    const uint32_t smem_base = smem_u32(smem);
    Swap16Layout<kNTiles> lay(p, expert);  // persistent: re-aimed at each tile's expert
    const __nv_bfloat16* xbase = p.x + static_cast<int64_t>(kb_begin) * kKBlock;
    auto load = [&](auto nthreads, int t, int slot, int kb) {
      load_stage<decltype(nthreads)::value>(p, in_row, xbase, lay, n_block * kNTiles, kb_begin, t,
                                            smem_base + slot * kStageBytes, kb);
    };
    zero_acc(acc);
    const uint64_t desc0 = smem_desc_k128(smem_base);

    if constexpr (PRODUCER == 0) {
      // Every thread copies NTW 16-byte chunks of weights per stage (kThreads * NTW == kNTiles *
      // 32; chunk i of thread t is tile t/32 + i * WARPS), the first kNTiles * 4 threads one of
      // scales, and BT * 8 / kThreads activation chunks.
      // The copy plan is fixed for the tile: each source pointer, destination offset and byte
      // count is computed once here, and each K block only advances the sources by one K block
      // (the per-block row lookup, 64-bit row * K product and select cost ~90 of ~190
      // instructions per warp and K block in the SASS of the 128x256 tile before). (Sharing
      // load_stage here, as the producer does, costs more instructions per K block still.)
      static_assert(kThreads * kNTW == kNTiles * 32, "multistage: NTW weight chunks per thread");
      static_assert(kNTiles * 4 <= kThreads, "multistage: at most one scale chunk per thread");
      static_assert(kThreads % 64 == 0, "multistage: a thread's activation chunks share their swizzle phase");
      constexpr int kXChunks = BT * 8;
      constexpr int kXIters = (kXChunks + kThreads - 1) / kThreads;
      const __nv_bfloat16* xsrc[kXIters];
      uint32_t xskip[kXIters];  // 1: a padding row, zero-filled
      const uint32_t xdst = (tid / 8) * 128 + (((tid % 8) ^ ((tid / 8) & 7)) * 16);
      auto aim_rows = [&](const int64_t* __restrict__ rows) {
#pragma unroll
        for (int it = 0; it < kXIters; ++it) {
          const int c = tid + it * kThreads;
          const int64_t row = (kXChunks % kThreads == 0 || c < kXChunks) ? rows[c / 8] : -1;
          xsrc[it] = xbase + (row >= 0 ? row * p.k + (c % 8) * 8 : 0);
          xskip[it] = row >= 0 ? 0u : 1u;
        }
      };
      aim_rows(in_row);
      const bool has_scale = tid < kNTiles * 4;
      const int wstep = lay.group() * 32;  // uint4 from one K block of a tile to the next
      const int sstep = lay.group() * 64;  // bytes
      const uint4* wsrc[kNTW];
      const uint8_t* ssrc;
      // Points the weight and scale sources at K block kb_begin of tile `tile` (relative to the
      // CTA's first; common/params.cuh, Swap16Layout).
      auto aim = [&](int tile) {
        const int t0 = (n_block + tile) * kNTiles;
#pragma unroll
        for (int i = 0; i < kNTW; ++i)
          wsrc[i] = p.qweight + lay.block(t0 + tid / 32 + i * WARPS, kb_begin) * 32 + tid % 32;
        ssrc = reinterpret_cast<const uint8_t*>(p.scales + lay.block(t0 + (has_scale ? tid / 4 : 0), kb_begin) * 8) +
               (has_scale ? (tid % 4) * 16 : 0);
      };
      aim(0);
      // Bulk copies: one mbarrier per slot, initialized by thread 0, which alone arrives on it
      // and issues the copies (the other threads first wait on it after the first K block's
      // barrier); bk_tile / bk_kb: the tile and K block of thread 0's next bulk stage.
      __shared__ __align__(8) uint64_t bulk_full[kBulk ? STAGES : 1];
      int bk_tile = 0, bk_kb = 0;
      int64_t x_row0 = 0;  // TMA_X: the tile's first row of x (its rows are consecutive)
      if constexpr (kBulk) {
        if (tid == 0) {
#pragma unroll
          for (int s = 0; s < STAGES; ++s) mbar_init(&bulk_full[s], 1);
          mbar_fence_init();
          if constexpr (kTmaX) tma_prefetch_descriptor(xmap);
        }
        if constexpr (kTmaX) x_row0 = in_row[0];
      }
      int load_tile = 0;
      int load_slot = 0;
      int load_kb = 0;  // K block of the next load within its tile
      // persistent: tiles 0 .. resolved-1 of this CTA are resolved (the first by the caller)
      int resolved = 1;
      if constexpr (kPersist) {
        resolved += walker->commit(p, 1) ? 1 : 0;
        __syncthreads();  // publishes tile 1's rows (the ring reaches tile 1 after another barrier anyway)
      }
      // From a tile's last K block to tile t (of the CTA's item) of the next N block: the same
      // activation rows, the weights and scales kNTiles 16-row tiles further.
      auto next_n_block = [&](int t) {
#pragma unroll
        for (int it = 0; it < kXIters; ++it) xsrc[it] -= KB * kKBlock;
        if constexpr (Swap16Layout<kNTiles>::kFixed) {
#pragma unroll
          for (int i = 0; i < kNTW; ++i) wsrc[i] += lay.next_n_block(KB) * 32;
          ssrc += lay.next_n_block(KB) * 64;
        } else {
          aim(t);
        }
      };
      // Copies the next K block (they come in order, N block by N block) into the next ring slot. After
      // a tile's last block the sources move on to the next N block: the same activation rows,
      // the weights and scales kNTiles 16-row tiles further.
      auto load_next = [&]() {
        const uint32_t st = smem_base + load_slot * kStageBytes;
        if constexpr (kBulk) {
          if (tid == 0) {
            const uint32_t bar = smem_u32(&bulk_full[load_slot]);
            mbar_arrive_expect_tx(&bulk_full[load_slot], kTxBytes);
            if constexpr (kTmaX) {
              tma_load_2d(st, xmap, (kb_begin + bk_kb) * kKBlock, static_cast<int>(x_row0), bar);
            }
            if constexpr (kBulkW) {
              const int t0 = (n_block + bk_tile) * kNTiles;
#pragma unroll
              for (int j = 0; j < kGroups; ++j) {
                const int64_t b = lay.block(t0 + 8 * j, kb_begin + bk_kb);
                bulk_copy_g2s(st + kXBytes + j * 4096, p.qweight + b * 32, 4096, bar);
                bulk_copy_g2s(st + kXBytes + kWBytes + j * 512, p.scales + b * 8, 512, bar);
              }
            }
            if (++bk_kb == KB) {
              bk_kb = 0;
              ++bk_tile;
            }
          }
        }
        if constexpr (!kTmaX) {
#pragma unroll
          for (int it = 0; it < kXIters; ++it) {
            if (kXChunks % kThreads == 0 || tid + it * kThreads < kXChunks)
              cp_async_16_zfill(st + xdst + it * kThreads * 16, xsrc[it], xskip[it]);
            xsrc[it] += kKBlock;
          }
        }
        if constexpr (!kBulkW) {
#pragma unroll
          for (int i = 0; i < kNTW; ++i) {
            cp_async_16_u32(st + kXBytes + (tid + i * kThreads) * 16, wsrc[i], true);
            wsrc[i] += wstep;
          }
          cp_async_16_if(st + kXBytes + kWBytes + tid * 16, ssrc, has_scale);
          ssrc += sstep;
        }
        load_slot = load_slot + 1 == STAGES ? 0 : load_slot + 1;
        if constexpr (NTILES > 1 && !kPersist) {
          if (++load_kb == KB) {
            load_kb = 0;
            if constexpr (Swap16Layout<kNTiles>::kFixed) {
              next_n_block(0);  // (after the last tile too: no load follows)
            } else if (++load_tile < NTILES) {
              next_n_block(load_tile);
            }
          }
        }
        if constexpr (kPersist) {
          if (++load_kb == KB) {
            load_kb = 0;
            const int in_item = ++load_tile % NTILES;  // tile within the CTA's current item
            if (in_item != 0) {
              next_n_block(in_item);
            } else {  // the CTA's next item (resolved already), or the end
              const int item = load_tile / NTILES;
              if (item < resolved) {
                const int b = item % Walker::kBuffers;
                lay = Swap16Layout<kNTiles>(p, walker->expert(b));
                n_block = walker->n_block(b) * NTILES;
                aim_rows(walker->in_rows(b));
                aim(0);
              }
            }
          }
        }
      };
      // ring positions [0, TOTAL) are loaded (persistent: until the tiles run out)
      auto loads_left = [&](int pos) { return kPersist ? load_tile / NTILES < resolved : pos < KB * NTILES; };
      // Prologue: kDist K blocks in flight (one more slot is read by the group in flight).
#pragma unroll
      for (int s = 0; s < kDist; ++s) {
        if (loads_left(s)) load_next();
        cp_async_commit();
      }
      for (int tile = 0; kPersist || tile < NTILES; ++tile) {
        if (tile > 0) zero_acc(acc);
        fence_acc(acc);
        k_loop(KB, [&](int kb, auto& a, auto drain) {
          const int g = tile * KB + kb;  // ring position
          cp_async_wait<kDist - 1>();
          fence_proxy_async_shared();  // cp.async writes -> visible to the tensor cores' async proxy
          __syncthreads();             // block g landed for all; groups <= g-2 retired in all warps
          if (loads_left(g + kDist)) load_next();
          cp_async_commit();
          if constexpr (kBulk) mbar_wait(&bulk_full[g % STAGES], (g / STAGES) & 1);  // the bulk part of block g
          mma_block(smem, desc0, g % STAGES, warp, lane, a, acc);
          retire(kb, KB, drain);
        });
        wgmma_wait<0>();
        fence_acc(acc);
        if constexpr (NTILES > 1 || kPersist) epilogue(tile, acc);  // its shared memory lies after the ring
        if constexpr (kPersist) {
          if ((tile + 1) % NTILES == 0) {  // the item's last tile
            const int item = tile / NTILES;
            if (item + 1 >= resolved) break;  // no item after this one
            // item + 2, prefetched one item ago, into the buffer item - 1 left (published by the
            // next K block's barrier, before the ring reaches it)
            if (resolved == item + 2 && walker->commit(p, (item + 2) % Walker::kBuffers)) ++resolved;
          }
        }
      }
      cp_async_wait<0>();
    } else {
      __shared__ __align__(8) uint64_t full[STAGES];
      __shared__ __align__(8) uint64_t empty[STAGES];
      if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
          mbar_init(&full[s], 128);         // the producer warpgroup's threads
          mbar_init(&empty[s], kMmaWarps * 32);  // every consumer thread arrives
        }
        mbar_fence_init();
      }
      __syncthreads();
      if (warp >= kMmaWarps) {  // producer warpgroup
        setmaxnreg_dec<kProducerRegs>();
        using Producers = std::integral_constant<int, 128>;
        const int t = tid - kMmaWarps * 32;
        for (int kb = 0; kb < KB; ++kb) {
          const int slot = kb % STAGES;
          if (kb >= STAGES) mbar_wait(&empty[slot], ((kb / STAGES) - 1) & 1);
          load(Producers{}, t, slot, kb);
          cp_async_commit();
          if (kb >= kLag) {  // the group of block kb - kLag has landed: publish it
            cp_async_wait<kLag>();
            fence_proxy_async_shared();
            mbar_arrive(&full[(kb - kLag) % STAGES]);
          }
        }
        cp_async_wait<0>();
        fence_proxy_async_shared();
        for (int kb = KB > kLag ? KB - kLag : 0; kb < KB; ++kb) mbar_arrive(&full[kb % STAGES]);
        return;
      } else {  // consumer warps
        setmaxnreg_inc<kConsumerRegs>();
        fence_acc(acc);
        k_loop(KB, [&](int kb, auto& a, auto drain) {
          const int slot = kb % STAGES;
          mbar_wait(&full[slot], (kb / STAGES) & 1);
          mma_block(smem, desc0, slot, warp, lane, a, acc);
          retire(kb, KB, drain);
          // groups <= kb - WAIT have retired: their slots go back to the producer. Every thread
          // arrives (release) after its own reads of the slot (the swap16 words and scales it
          // dequantized), so each read is ordered before the producer's copies into the slot by
          // the barrier itself. (One lane arriving for the warp after a __syncwarp is also ordered
          // by the memory model's cumulativity, but racecheck does not follow that chain and
          // reported lanes 1-31's reads against the copies: 22 hazards on the H200.)
          const int done = kb - WAIT;
          if (done >= 0 && kb + 1 < KB) mbar_arrive(&empty[done % STAGES]);
        });
        wgmma_wait<0>();
        fence_acc(acc);
        epilogue_sync<kEpilogueThreads, false>();  // all consumers done reading the ring
        epilogue(0, acc);
        return;
      }
    }
    __syncthreads();  // every read of the pipeline's shared memory is done (the epilogue reuses it)
    if constexpr (NTILES == 1 && !kPersist) epilogue(0, acc);
  }
};

}  // namespace chord

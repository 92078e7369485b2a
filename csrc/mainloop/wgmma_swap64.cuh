// Main loop `wgmma`: the operand swap at warpgroup scale (sm_90a).
//
// Each warp owns one 16-row weight tile (BN/16 warps, BN/64 warpgroups); a warpgroup's four
// tiles are the 64-row A operand of `wgmma.mma_async.m64n{BT}k16`, dequantized int4 -> bf16 in
// registers straight from the swap16 words (a warp's 16 rows of a wgmma A fragment have the
// per-lane arrangement of the mma.m16n8k16 A fragment, which is what a swap16 word holds). The
// BT token rows are the N side, read by the tensor cores from shared memory through a matrix
// descriptor: each 64-wide K block of a token row is one 128-byte row with the 128-byte swizzle,
// exactly the XOR swizzle the cp.async gather writes.
//
// Weights are loaded without an L2 eviction hint: at prefill a weight tile is read by every token
// tile of its raster group, so it should stay in L2. (With the hint, ptxas 13.0 put the 64-bit
// policy of the BN=64 kernels in an odd uniform register, which faulted as an illegal
// instruction on the H200.)
//
// Pipeline: a STAGES-deep cp.async ring of [activations | swap16 words | scales] per 64-wide K
// block. Per K block a warp reads its words and scales, dequantizes the four k16 steps into one
// of two register sets, issues four wgmmas as one group and waits until at most WAIT groups are
// in flight. WAIT = 1 (batched `wait_group 1`): the tensor cores run block kb while the warps
// dequantize kb+1; a ring slot is refilled two blocks after it was read, once the group that
// read it has retired in every warp (a CTA barrier lies between). WAIT = 0 retires each group
// before the next dequantization; both issue the same MMAs in the same order, so their outputs
// are bit-identical.
//
// PRODUCER = 0 (multistage): every thread issues its share of the cp.async copies and a CTA
// barrier per K block publishes a stage. PRODUCER = 1 (warp-specialized): an extra warpgroup
// issues all copies, with its registers handed to the consumers (setmaxnreg 88 / the rest); it
// publishes a stage on the stage's `full` mbarrier once its cp.async group has landed
// (wait_group + proxy fence + arrive), and the consumer threads hand the slot back on its
// `empty` mbarrier (each one arrives) when the wgmma group that read it has retired. Consumers
// never wait for each other, only for data. The MMAs and their order are the same in both (bit-identical outputs).
#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>

#include "../common/dequant.cuh"
#include "../common/mbarrier.cuh"
#include "../common/params.cuh"
#include "../common/ptx.cuh"
#include "../common/wgmma.cuh"
#include "../moe/epilogue.cuh"

namespace chord {

template <int BT, int BN, int STAGES, int WAIT, int PRODUCER = 0>
struct WgmmaSwap64 {
  static_assert(BT % 8 == 0 && BT >= 8 && BT <= 256, "wgmma main loop: BT multiple of 8 in [8, 256]");
  static_assert(BN % 64 == 0 && BN >= 64 && BN <= 256, "wgmma main loop: BN in {64, 128, 192, 256}");
  static_assert(STAGES >= 3, "wgmma main loop: STAGES >= 3 (one slot is read by the group in flight)");
  static_assert(WAIT == 0 || WAIT == 1, "wgmma main loop: WAIT is 0 or 1");
  static_assert(PRODUCER == 0 || PRODUCER == 1, "wgmma main loop: PRODUCER is 0 or 1");
  static constexpr int kMmaWarps = BN / 16;  // one 16-row weight tile per warp
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
  static constexpr int kNTW = 1;
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

  using Acc = float[1][kTT][4];

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

  // The consumer half of one K block: this warp's swap16 words and scales of ring slot `slot`,
  // dequantized into register set `a`, then four wgmmas (k16 steps) committed as one group.
  __device__ __forceinline__ static void mma_block(const uint8_t* smem, uint64_t desc0, int slot, int warp, int lane,
                                                   uint32_t (&a)[4][4], Acc& acc) {
    const uint8_t* st = smem + slot * kStageBytes;
    const uint4 words = reinterpret_cast<const uint4*>(st + kXBytes)[warp * 32 + lane];
    const uint2 scl = reinterpret_cast<const uint2*>(st + kXBytes + kWBytes)[warp * 8 + lane / 4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __nv_bfloat162 sp = as_bf162(h == 0 ? scl.x : scl.y);
      const __nv_bfloat162 s_lo = __low2bfloat162(sp);
      const __nv_bfloat162 s_hi = __high2bfloat162(sp);
      dequant_swap16(h == 0 ? words.x : words.z, s_lo, s_hi, a[2 * h]);
      dequant_swap16(h == 0 ? words.y : words.w, s_lo, s_hi, a[2 * h + 1]);
    }
    wgmma_fence();
    const uint64_t desc = desc0 + static_cast<uint64_t>((slot * kStageBytes) >> 4);
#pragma unroll
    for (int s = 0; s < 4; ++s) WgmmaRA<BT>::mma(acc[0], a[s], desc + static_cast<uint64_t>(s * 2), 1);
    wgmma_commit();
  }

  // Runs `block(kb, a, drain)` over kb = 0..KB-1 with the two register sets alternating; an odd
  // count starts with a lone block that retires its group before the loop (ptxas must never see
  // a group in flight where two paths join).
  template <class Block>
  __device__ __forceinline__ static void k_loop(int KB, Block&& block) {
    uint32_t a0[4][4], a1[4][4];
    int kb = 0;
    if (KB & 1) block(kb++, a1, std::true_type{});
    for (; kb < KB; kb += 2) {
      block(kb, a0, std::false_type{});
      block(kb + 1, a1, std::false_type{});
    }
  }

  // wait_group after block kb: everything on the last block (the epilogue reads acc next).
  template <class Drain>
  __device__ __forceinline__ static void retire(int kb, int KB, Drain) {
    if (Drain::value || kb + 1 == KB) {
      wgmma_wait<0>();
    } else {
      wgmma_wait<WAIT>();  // no accumulator access here: a group may still be in flight
    }
  }

  // Accumulates K blocks [kb_begin, kb_end) of NTILES consecutive N blocks from `n_block` and
  // calls epilogue(t, acc) after tile t (see MmaSwap16::run; NTILES > 1: multistage only). The
  // producer warpgroup returns without calling it: the consumers alone run the epilogue (its
  // code never joins the producer's, whose registers were given away).
  template <int NTILES, class Epilogue>
  __device__ __forceinline__ static void run(const GemmParams& p, int expert, int n_block,
                                             const int64_t* __restrict__ in_row, int kb_begin, int kb_end,
                                             uint8_t* smem, Acc& acc, Epilogue&& epilogue) {
    static_assert(NTILES == 1 || PRODUCER == 0, "wgmma main loop: NTILES > 1 needs PRODUCER == 0");
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int KB = kb_end - kb_begin;
    const uint32_t smem_base = smem_u32(smem);
    const Swap16Layout<kNTiles> lay(p, expert);
    const __nv_bfloat16* xbase = p.x + static_cast<int64_t>(kb_begin) * kKBlock;
    auto load = [&](auto nthreads, int t, int slot, int kb) {
      load_stage<decltype(nthreads)::value>(p, in_row, xbase, lay, n_block * kNTiles, kb_begin, t,
                                            smem_base + slot * kStageBytes, kb);
    };
    auto zero = [&]() {
#pragma unroll
      for (int i = 0; i < kTT; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[0][i][c] = 0.f;
    };

    zero();
    const uint64_t desc0 = smem_desc_k128(smem_base);

    if constexpr (PRODUCER == 0) {
      // Every thread copies one 16-byte chunk of weights per stage (kThreads == kNTiles * 32),
      // the first kNTiles * 4 threads one of scales, and BT * 8 / kThreads activation chunks.
      // The copy plan is fixed for the tile: each source pointer, destination offset and byte
      // count is computed once here, and each K block only advances the sources by one K block
      // (the per-block row lookup, 64-bit row * K product and select cost ~90 of ~190
      // instructions per warp and K block in the SASS of the 128x256 tile before). (Sharing
      // load_stage here, as the producer does, costs more instructions per K block still.)
      static_assert(kThreads == kNTiles * 32, "multistage: one weight chunk per thread");
      static_assert(kThreads % 64 == 0, "multistage: a thread's activation chunks share their swizzle phase");
      constexpr int kXChunks = BT * 8;
      constexpr int kXIters = (kXChunks + kThreads - 1) / kThreads;
      const __nv_bfloat16* xsrc[kXIters];
      uint32_t xskip[kXIters];  // 1: a padding row, zero-filled
      const uint32_t xdst = (tid / 8) * 128 + (((tid % 8) ^ ((tid / 8) & 7)) * 16);
#pragma unroll
      for (int it = 0; it < kXIters; ++it) {
        const int c = tid + it * kThreads;
        const int64_t row = (kXChunks % kThreads == 0 || c < kXChunks) ? in_row[c / 8] : -1;
        xsrc[it] = xbase + (row >= 0 ? row * p.k + (c % 8) * 8 : 0);
        xskip[it] = row >= 0 ? 0u : 1u;
      }
      const bool has_scale = tid < kNTiles * 4;
      const int wstep = lay.group() * 32;  // uint4 from one K block of a tile to the next
      const int sstep = lay.group() * 64;  // bytes
      const uint4* wsrc;
      const uint8_t* ssrc;
      // Points the weight and scale sources at K block kb_begin of tile `tile` (relative to the
      // CTA's first; common/params.cuh, Swap16Layout).
      auto aim = [&](int tile) {
        const int t0 = (n_block + tile) * kNTiles;
        wsrc = p.qweight + lay.block(t0 + tid / 32, kb_begin) * 32 + tid % 32;
        ssrc = reinterpret_cast<const uint8_t*>(p.scales + lay.block(t0 + (has_scale ? tid / 4 : 0), kb_begin) * 8) +
               (has_scale ? (tid % 4) * 16 : 0);
      };
      aim(0);
      int load_tile = 0;
      int load_slot = 0;
      int load_kb = 0;  // K block of the next load within its tile
      // Copies the next K block (they come in order, N block by N block) into the next ring slot. After
      // a tile's last block the sources move on to the next N block: the same activation rows,
      // the weights and scales kNTiles 16-row tiles further.
      auto load_next = [&]() {
        const uint32_t st = smem_base + load_slot * kStageBytes;
#pragma unroll
        for (int it = 0; it < kXIters; ++it) {
          if (kXChunks % kThreads == 0 || tid + it * kThreads < kXChunks)
            cp_async_16_zfill(st + xdst + it * kThreads * 16, xsrc[it], xskip[it]);
          xsrc[it] += kKBlock;
        }
        cp_async_16_u32(st + kXBytes + tid * 16, wsrc, true);
        cp_async_16_if(st + kXBytes + kWBytes + tid * 16, ssrc, has_scale);
        wsrc += wstep;
        ssrc += sstep;
        load_slot = load_slot + 1 == STAGES ? 0 : load_slot + 1;
        if constexpr (NTILES > 1) {
          if (++load_kb == KB) {
            load_kb = 0;
#pragma unroll
            for (int it = 0; it < kXIters; ++it) xsrc[it] -= KB * kKBlock;
            if constexpr (Swap16Layout<kNTiles>::kFixed) {
              wsrc += lay.next_n_block(KB) * 32;
              ssrc += lay.next_n_block(KB) * 64;
            } else if (++load_tile < NTILES) {
              aim(load_tile);
            }
          }
        }
      };
      const int TOTAL = KB * NTILES;
      // Prologue: STAGES-2 K blocks in flight (one more slot is read by the group in flight).
#pragma unroll
      for (int s = 0; s < STAGES - 2; ++s) {
        if (s < TOTAL) load_next();
        cp_async_commit();
      }
      for (int tile = 0; tile < NTILES; ++tile) {
        if (tile > 0) zero();
        wgmma_fence_operand(acc[0]);
        k_loop(KB, [&](int kb, uint32_t (&a)[4][4], auto drain) {
          const int g = tile * KB + kb;  // ring position
          cp_async_wait<STAGES - 3>();
          fence_proxy_async_shared();  // cp.async writes -> visible to the tensor cores' async proxy
          __syncthreads();             // block g landed for all; groups <= g-2 retired in all warps
          if (g + STAGES - 2 < TOTAL) load_next();
          cp_async_commit();
          mma_block(smem, desc0, g % STAGES, warp, lane, a, acc);
          retire(kb, KB, drain);
        });
        wgmma_wait<0>();
        wgmma_fence_operand(acc[0]);
        if constexpr (NTILES > 1) epilogue(tile, acc);  // its shared memory lies after the ring
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
        wgmma_fence_operand(acc[0]);
        k_loop(KB, [&](int kb, uint32_t (&a)[4][4], auto drain) {
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
        wgmma_fence_operand(acc[0]);
        epilogue_sync<kEpilogueThreads, false>();  // all consumers done reading the ring
        epilogue(0, acc);
        return;
      }
    }
    __syncthreads();  // every read of the pipeline's shared memory is done (the epilogue reuses it)
    if constexpr (NTILES == 1) epilogue(0, acc);
  }
};

}  // namespace chord

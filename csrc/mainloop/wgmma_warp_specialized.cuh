// Main loop `wgmma`, warp-specialized (the wgmma tile of wgmma_tile.cuh fed by a producer): an
// extra warpgroup issues all copies, with its registers handed to the consumers (setmaxnreg 88 /
// the rest); it publishes a stage on the stage's `full` mbarrier once its cp.async group has
// landed (wait_group + proxy fence + arrive), and the consumer threads hand the slot back on its
// `empty` mbarrier (each one arrives) when the wgmma group that read it has retired. Consumers
// never wait for each other, only for data. The MMAs and their order are those of the multistage
// loop (bit-identical outputs). One tile per CTA: no N tiles, persistent walk or bulk copies.

#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>

#include "../common/mbarrier.cuh"
#include "../common/params.cuh"
#include "../common/ptx.cuh"
#include "../common/wgmma.cuh"
#include "wgmma_tile.cuh"

namespace chord {

// Cfg: the schedule's configuration struct (chord.jit.render_config); this loop reads the tile's
// knobs (producer = 1 selects it).
template <class Cfg>
struct WgmmaWarpSpecialized : WgmmaTile<Cfg> {
  CHORD_WGMMA_TILE_NAMES;
  using Tile::kEpilogueThreads;
  static constexpr int kThreads = kMmaWarps * 32 + 128;
  // The producer warpgroup gives registers to the consumers (setmaxnreg). The CTA
  // starts with kEntryRegs per thread (ptxas' cap for __launch_bounds__(kThreads, 1)); the
  // consumers may take only what the producer gives back, else setmaxnreg.inc would wait forever.
  static constexpr int kProducerRegs = 88;
  static constexpr int kEntryRegsRaw = 65536 / kThreads / 8 * 8;
  static constexpr int kEntryRegs = kEntryRegsRaw > 256 ? 256 : kEntryRegsRaw;
  static constexpr int kConsumerRegsRaw =
      (kEntryRegs + 128 * (kEntryRegs - kProducerRegs) / (kMmaWarps * 32)) / 8 * 8;
  static constexpr int kConsumerRegs = kConsumerRegsRaw > 256 ? 256 : kConsumerRegsRaw;
  static_assert(kConsumerRegs > kEntryRegs,
                "wgmma main loop: the producer warpgroup has no registers to hand over at this tile (BN <= 192)");
  static_assert(kMmaWarps * 32 * (kConsumerRegs - kEntryRegs) <= 128 * (kEntryRegs - kProducerRegs),
                "wgmma main loop: consumers would take more registers than the producer gives back");
  // Stages whose copies may still be in flight before the producer publishes the
  // oldest (<= STAGES - 2, so the producer never waits for a slot it has not published yet).
  static constexpr int kLag = STAGES - 2;

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

  // Accumulates K blocks [kb_begin, kb_end) of N block `n_block` and calls epilogue(0, acc) from
  // the consumer warps. The producer warpgroup returns without calling it: the consumers alone run
  // the epilogue (its code never joins the producer's, whose registers were given away).
  template <int NTILES, class Epilogue, class Walker = NoWalker>
  __device__ __forceinline__ static void run(const GemmParams& p, int expert, int n_block,
                                             const int64_t* __restrict__ in_row, int kb_begin, int kb_end,
                                             uint8_t* smem, Acc& acc, Epilogue&& epilogue, Walker* walker = nullptr) {
    static_assert(NTILES == 1, "warp-specialized wgmma main loop: one N block per CTA");
    static_assert(std::is_same<Walker, NoWalker>::value, "warp-specialized wgmma main loop: one item per CTA");
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

    __shared__ __align__(8) uint64_t full[STAGES];
    __shared__ __align__(8) uint64_t empty[STAGES];
    // full: the producer warpgroup's threads; empty: every consumer thread arrives
    mbar_init_ring(full, empty, 128, kMmaWarps * 32);
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
};

}  // namespace chord

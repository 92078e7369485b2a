// Main loop `wgmma`, warp-specialized (the wgmma tile of wgmma_tile.cuh fed by a producer): an
// extra warpgroup issues all copies, with its registers handed to the consumers (setmaxnreg: the
// producer keeps what its gather needs, 40 / 48 / 88 by token tile, the consumers get the rest). Per stage, where the N block is whole tile groups of 8 (BN % 128 == 0), its thread 0
// announces the weight and scale bytes on the slot's `full` mbarrier and moves them with the copy
// engine (cp.async.bulk: one 4 KB and one 512-byte run per group); its 128 threads gather the
// activation rows with 16-byte cp.async copies (other N blocks: the weights and scales too) that
// arrive on the same barrier when they land (cp.async.mbarrier.arrive.noinc), so the producer
// never waits for its own copies, only for a free slot. The consumers wait on `full`, make the
// cp.async bytes visible to the tensor cores (proxy fence) and hand the slot back on its `empty`
// mbarrier (each thread arrives) when the wgmma group that read it has retired. Consumers never
// wait for each other, only for data: no CTA barrier in the K loop. The MMAs and their order are
// those of the multistage loop (bit-identical outputs). One tile per CTA: no N tiles or
// persistent walk.

#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>

#include "../common/mbarrier.cuh"
#include "../common/params.cuh"
#include "../common/ptx.cuh"
#include "../common/stamps.cuh"
#include "../common/tma.cuh"
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
  // The producer keeps what its copy plan needs: kXIters 64-bit row sources and skip flags grow
  // with the token tile (BT / 16 each). 40 registers hold BT <= 64, 48 BT <= 128 and 88 the rest
  // with no spill in nvcc 13.0's ptxas. Keeping fewer matters: the consumers of the 64-token wide
  // tile (NTW 4: 128 accumulators and 64 A registers a thread) got 208 with the producer at 88,
  // and ptxas serialized their wgmmas for want of registers (its warning C7512); with 40 they get
  // 232 and no warning. chord.knobs.wgmma_producer_regs says the same for the host's checks.
  static constexpr int kXItersProducer = (BT * 8 + 127) / 128;
  static constexpr int kProducerRegs = kXItersProducer <= 4 ? 40 : kXItersProducer <= 8 ? 48 : 88;
  static constexpr int kEntryRegsRaw = 65536 / kThreads / 8 * 8;
  static constexpr int kEntryRegs = kEntryRegsRaw > 256 ? 256 : kEntryRegsRaw;
  static constexpr int kConsumerRegsRaw =
      (kEntryRegs + 128 * (kEntryRegs - kProducerRegs) / (kMmaWarps * 32)) / 8 * 8;
  static constexpr int kConsumerRegs = kConsumerRegsRaw > 256 ? 256 : kConsumerRegsRaw;
  static_assert(kConsumerRegs > kEntryRegs,
                "wgmma main loop: the producer warpgroup has no registers to hand over at this tile (BN <= 192)");
  static_assert(kMmaWarps * 32 * (kConsumerRegs - kEntryRegs) <= 128 * (kEntryRegs - kProducerRegs),
                "wgmma main loop: consumers would take more registers than the producer gives back");
  // Weights and scales by the copy engine wherever the N block is whole tile groups of 8
  // (common/params.cuh Swap16Layout: K block kb of one group is one 4 KB run of swap16 words and
  // one 512-byte run of scales); else the producer threads' cp.async copies.
  static constexpr bool kBulkW = BN % 128 == 0 && Swap16Layout<kNTiles>::kFixed;
  static constexpr int kGroups = BN / 128;
  static constexpr uint32_t kTxBytes = kBulkW ? kWBytes + kSBytes : 0;
  static constexpr int kProducers = 128;
  static constexpr int kXChunks = BT * 8;  // 16-byte activation chunks per stage
  static constexpr int kXIters = Tile::template kXIters<kProducers>;
  static constexpr int kWChunks = kNTiles * 32, kSChunks = kNTiles * 4;

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
    zero_acc(acc);
    const uint64_t desc0 = smem_desc_k128(smem_base);

    __shared__ __align__(8) uint64_t full[STAGES];
    __shared__ __align__(8) uint64_t empty[STAGES];
    // full: the producer threads' cp.async arrivals (+ thread 0's byte announcement for the copy
    // engine's part); empty: every consumer thread arrives
    mbar_init_ring(full, empty, kProducers + (kBulkW ? 1 : 0), kMmaWarps * 32);
    if (warp >= kMmaWarps) {  // producer warpgroup
      setmaxnreg_dec<kProducerRegs>();
      const int t = tid - kMmaWarps * 32;
      // The copy plan is fixed for the tile (WgmmaTile::aim_x): each K block only advances the sources.
      const __nv_bfloat16* xsrc[kXIters];
      uint32_t xskip[kXIters];
      const uint32_t xdst = Tile::x_dst(t);
      Tile::template aim_x<kProducers>(in_row, xbase, p.k, t, xsrc, xskip);
      const int t0 = n_block * kNTiles;
      for (int kb = 0; kb < KB; ++kb) {
        const int slot = kb % STAGES;
        if (kb >= STAGES) mbar_wait(&empty[slot], ((kb / STAGES) - 1) & 1);
        const uint32_t st = smem_base + slot * kStageBytes;
        if constexpr (kBulkW) {
          if (t == 0) {
            const uint32_t bar = smem_u32(&full[slot]);
            mbar_arrive_expect_tx(&full[slot], kTxBytes);
#pragma unroll
            for (int j = 0; j < kGroups; ++j) {
              const int64_t b = lay.block(t0 + 8 * j, kb_begin + kb);
              bulk_copy_g2s(st + kXBytes + j * 4096, p.qweight + b * 32, 4096, bar);
              bulk_copy_g2s(st + kXBytes + kWBytes + j * 512, p.scales + b * 8, 512, bar);
            }
          }
        } else {
#pragma unroll
          for (int it = 0; it < (kWChunks + kProducers - 1) / kProducers; ++it) {
            const int c = t + it * kProducers;
            if (kWChunks % kProducers == 0 || c < kWChunks)
              cp_async_16_u32(st + kXBytes + c * 16, p.qweight + lay.block(t0 + c / 32, kb_begin + kb) * 32 + c % 32,
                              true);
          }
          if (t < kSChunks)
            cp_async_16_u32(st + kXBytes + kWBytes + t * 16,
                            reinterpret_cast<const uint8_t*>(p.scales + lay.block(t0 + t / 4, kb_begin + kb) * 8) +
                                (t % 4) * 16,
                            true);
        }
#pragma unroll
        for (int it = 0; it < kXIters; ++it) {
          if (kXChunks % kProducers == 0 || t + it * kProducers < kXChunks)
            cp_async_16_zfill(st + xdst + it * kProducers * 16, xsrc[it], xskip[it]);
          xsrc[it] += kKBlock;
        }
        // this thread's copies of the stage arrive on `full` when they land (no wait here: the
        // producer goes on to the next slot at once)
        cp_async_mbar_arrive_noinc(&full[slot]);
      }
      cp_async_wait<0>();  // this warpgroup's copies have landed before it leaves
      return;
    } else {  // consumer warps
      setmaxnreg_inc<kConsumerRegs>();
      fence_acc(acc);
      k_loop(KB, [&](int kb, auto& a, auto drain) {
        const int slot = kb % STAGES;
        mbar_wait(&full[slot], (kb / STAGES) & 1);
        if (kb == 0) CHORD_STAMP_MIN(kStampFirstClk);
        fence_proxy_async_shared();  // the producer's cp.async writes -> the tensor cores' async proxy
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

// Main loop `wgmma`, multistage (the wgmma tile of wgmma_tile.cuh in a cp.async ring): every
// thread issues its share of the copies and a CTA barrier per K block publishes a stage.
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
//
// L2 policies (L2_HINT, the thread copies only): 1 = the activation rows are read evict-last
// and the swap16 words and scales evict-first, 2 = the activation rows evict-last and the
// weights without a hint, 0 = no hint. An indexed tile gathers its token rows, and a token
// routed to 8 experts has its row read by 8 experts' tiles in every N block, spread over the
// grid's waves; the hint asks L2 to keep those rows while the weights stream past. Measured
// (docs/optimizations.md, "L2 policies for gathered rows"): DRAM bytes 1.00x -> 0.94x the floor
// at EP8 prefill tok128, unchanged at TP8 m4096, no time gained on either (both tensor-bound).
// Same bytes in shared memory, same MMAs: bit-identical.

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

// Cfg: the schedule's configuration struct (chord.jit.render_config); besides the tile's knobs
// this loop reads bulk_w, tma_x and l2_hint.
template <class Cfg>
struct WgmmaMultistage : WgmmaTile<Cfg> {
  CHORD_WGMMA_TILE_NAMES;
  static constexpr bool BULK_W = Cfg::kBulkW;
  static constexpr bool TMA_X = Cfg::kTmaX;
  static constexpr int L2_HINT = Cfg::kL2Hint;
  static_assert(L2_HINT == 0 || (!BULK_W && !TMA_X), "wgmma main loop: L2_HINT hints the threads' cp.async copies");
  static_assert(BULK_W == 0 || (BN % 128 == 0 && Swap16Layout<BN / 16>::kFixed),
                "wgmma main loop: BULK_W needs whole tile groups of 8 (BN % 128 == 0, the default tile group cap)");
  static constexpr int kThreads = kMmaWarps * 32;
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

  // Accumulates K blocks [kb_begin, kb_end) of NTILES consecutive N blocks from `n_block` and
  // calls epilogue(t, acc) after tile t (see MmaSwap16::run).
  //
  // Persistent (`walker` given): after this first item (NTILES N blocks of one
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
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int KB = kb_end - kb_begin;
    const uint32_t smem_base = smem_u32(smem);
    Swap16Layout<kNTiles> lay(p, expert);  // persistent: re-aimed at each tile's expert
    const __nv_bfloat16* xbase = p.x + static_cast<int64_t>(kb_begin) * kKBlock;
    zero_acc(acc);
    const uint64_t desc0 = smem_desc_k128(smem_base);

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
    // L2_HINT: the policies, made once (a 64-bit register each; chord.jit rebuilds a kernel
    // without hints where ptxas put one in an odd uniform register)
    uint64_t x_policy = 0, w_policy = 0;
    if constexpr (L2_HINT != 0) x_policy = make_evict_last_policy();
    if constexpr (L2_HINT == 1) w_policy = make_evict_first_policy();
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
          if (kXChunks % kThreads == 0 || tid + it * kThreads < kXChunks) {
            if constexpr (L2_HINT != 0) {
              cp_async_16_zfill_hint(st + xdst + it * kThreads * 16, xsrc[it], xskip[it], x_policy);
            } else {
              cp_async_16_zfill(st + xdst + it * kThreads * 16, xsrc[it], xskip[it]);
            }
          }
          xsrc[it] += kKBlock;
        }
      }
      if constexpr (!kBulkW) {
#pragma unroll
        for (int i = 0; i < kNTW; ++i) {
          if constexpr (L2_HINT == 1) {
            cp_async_16_stream_u32(st + kXBytes + (tid + i * kThreads) * 16, wsrc[i], w_policy);
          } else {
            cp_async_16_u32(st + kXBytes + (tid + i * kThreads) * 16, wsrc[i], true);
          }
          wsrc[i] += wstep;
        }
        if constexpr (L2_HINT == 1) {
          cp_async_16_if_hint(st + kXBytes + kWBytes + tid * 16, ssrc, has_scale, w_policy);
        } else {
          cp_async_16_if(st + kXBytes + kWBytes + tid * 16, ssrc, has_scale);
        }
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
        if (g == 0) CHORD_STAMP_MIN(kStampFirstClk);
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
    __syncthreads();  // every read of the pipeline's shared memory is done (the epilogue reuses it)
    if constexpr (NTILES == 1 && !kPersist) epilogue(0, acc);
  }
};

}  // namespace chord

// Main loop `mma`: mma.sync.m16n8k16, by default operand-swapped (SWAP: weights = A/M side,
// tokens = B/N side, 8-token MMA tiles). SWAP = false is the swap's "off" side for its ablation:
// tokens on the M side in 16-row tiles (A from the same ldmatrix fragments) and the same
// dequantized weight registers as two n8 B operands; same copies, same weight layout.
//
// K is walked in 64-wide blocks through a STAGES-deep cp.async pipeline: weights (swap16
// words, found through Swap16Layout) and scales are copied verbatim into shared memory, the
// activation rows are gathered with an XOR swizzle so ldmatrix is conflict-free. Each warp owns NTW 16-row weight tiles and
// all BT/8 token tiles; it dequantizes one 16x16 weight tile per k16 step in registers.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "../common/dequant.cuh"
#include "../common/params.cuh"
#include "../common/ptx.cuh"
#include "../common/stamps.cuh"

namespace chord {

// Cfg: the schedule's configuration struct (chord.jit.render_config); this part reads block_m,
// block_n, warps, stages, swap and fold.
template <class Cfg>
struct MmaSwap16 {
  static constexpr int BT = Cfg::kBlockM;
  static constexpr int BN = Cfg::kBlockN;
  static constexpr int WARPS = Cfg::kWarps;
  static constexpr int STAGES = Cfg::kStages;
  static constexpr bool SWAP = Cfg::kSwap;
  static constexpr bool FOLD = Cfg::kFold;
  // FOLD: the code bias and the group scale are applied to fp32 partial sums, once per 32-K group
  // and output element, instead of to every dequantized bf16 pair (compute_stage_folded).
  static_assert(!FOLD || SWAP, "mma main loop: FOLD needs the operand swap (weights on the MMA M side)");
  static_assert(BT % 8 == 0 && BT >= 8 && BT <= 128, "mma main loop: BT multiple of 8 in [8, 128]");
  static_assert(SWAP || BT % 16 == 0, "unswapped mma main loop: BT multiple of 16 (tokens on the M side)");
  static constexpr bool kSwapped = SWAP;  // the accumulator layout the epilogue reads (moe/epilogue.cuh)
  static_assert(BN % (16 * WARPS) == 0, "mma main loop: BN multiple of 16*WARPS");
  static_assert(STAGES >= 2, "mma main loop: STAGES >= 2");
  static constexpr int kThreads = WARPS * 32;
  static constexpr int kMmaWarps = WARPS;           // warps holding accumulators
  static constexpr int kEpilogueThreads = kThreads;  // every thread runs the epilogue
  static constexpr int kNTiles = BN / 16;            // 16-row weight tiles per CTA
  static constexpr int kNTW = kNTiles / WARPS;       // per warp
  static constexpr int kTT = BT / 8;                 // 8-token MMA tiles
  static constexpr int kWBytes = kNTiles * 32 * 16;  // swap16 words per stage
  static constexpr int kSBytes = kNTiles * 8 * 8;    // scales per stage
  static constexpr int kXBytes = BT * kKBlock * 2;   // activations per stage
  static constexpr int kStageBytes = kWBytes + kSBytes + kXBytes;
  static constexpr int kSmemBytes = STAGES * kStageBytes;  // the pipeline (epilogue reuses it)
  static constexpr int kAlign = 128;                       // needed alignment of the smem base

  // SWAP: acc[j][i] is the m16n8 tile (16 features of weight tile j) x (tokens 8i..8i+7).
  // !SWAP: acc[j][2u + h] is the m16n8 tile (tokens 16u..16u+15) x (features 8h..8h+7 of tile j).
  using Acc = float[kNTW][kTT][4];

  // One thread's 16-byte copies of a ring stage (run and run_stream): kWIters weight and kSIters
  // scale chunks from sources aimed at K block 0 of a tile (each K block adds a stride), kXIters
  // activation chunks into XOR-swizzled rows (x_offset; an invalid row is zero-filled). The
  // arrays stay separate locals of run/run_stream: gathered into one struct, nvcc 13.0 allocates
  // the mma kernels' registers differently (other SASS, checked on 15 kernels), so they are not.
  static constexpr int kWChunks = kNTiles * 32;  // 16-byte weight chunks per stage
  static constexpr int kSChunks = kNTiles * 4;   // 16-byte scale chunks per stage
  static constexpr int kXChunks = BT * 8;        // 16-byte activation chunks per stage
  static constexpr int kWIters = (kWChunks + kThreads - 1) / kThreads;
  static constexpr int kSIters = (kSChunks + kThreads - 1) / kThreads;
  static constexpr int kXIters = (kXChunks + kThreads - 1) / kThreads;

  // Stage offset of activation row r's 16-byte column ch.
  __device__ __forceinline__ static uint32_t x_offset(int r, int ch) {
    return kWBytes + kSBytes + r * 128 + ((ch ^ (r & 7)) * 16);
  }

  // Copies K block kb into the ring stage at shared address st: each thread its 16-byte weight,
  // scale and activation chunks from sources aimed at K block 0 of a tile (kb strides added).
  template <int WI, int SI, int XI>
  __device__ __forceinline__ static void copy_stage(uint32_t st, const uint4* const (&wsrc)[WI],
                                                    const uint8_t* const (&ssrc)[SI],
                                                    const __nv_bfloat16* const (&xsrc)[XI], const uint32_t (&xdst)[XI],
                                                    const bool (&xvalid)[XI], int kb, int wstep, int sstep,
                                                    uint64_t evict_first) {
    constexpr int T = kThreads;
    const int tid = threadIdx.x;
#pragma unroll
    for (int it = 0; it < WI; ++it) {
      const int c = tid + it * T;
      if (kWChunks % T == 0 || c < kWChunks) cp_async_16_stream_u32(st + c * 16, wsrc[it] + kb * wstep, evict_first);
    }
#pragma unroll
    for (int it = 0; it < SI; ++it) {
      const int c = tid + it * T;
      if (kSChunks % T == 0 || c < kSChunks)
        cp_async_16_stream_u32(st + kWBytes + c * 16, ssrc[it] + kb * sstep, evict_first);
    }
#pragma unroll
    for (int it = 0; it < XI; ++it) {
      const int c = tid + it * T;
      if (kXChunks % T == 0 || c < kXChunks) cp_async_16_u32(st + xdst[it], xsrc[it] + kb * kKBlock, xvalid[it]);
    }
  }

  // A warp's swap16 words and scale pairs of one landed ring stage `st` (its kNTW weight tiles).
  __device__ __forceinline__ static void load_weight_fragments(const uint8_t* st, uint4 (&words)[kNTW],
                                                               uint2 (&scl)[kNTW]) {
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const uint4* sw = reinterpret_cast<const uint4*>(st);
    const uint2* ss = reinterpret_cast<const uint2*>(st + kWBytes);
#pragma unroll
    for (int j = 0; j < kNTW; ++j) {
      const int t = warp * kNTW + j;
      words[j] = sw[t * 32 + lane];
      scl[j] = ss[t * 8 + lane / 4];
    }
  }

  // FOLD: per 32-K scale group h, bias[i] = -136 * sum_k x (an MMA of the constant -136 with the
  // group's activation fragments, once per token tile for all of the warp's weight tiles); each
  // weight tile's group partial starts from it, takes the raw codes 128 + u as its A operand
  // (exact bf16) and ends as sum(q * x) in fp32, and acc += scale * partial. The weights' rows g /
  // g+8 (acc elements 0-1 / 2-3) take the low / high scale of the pair.
  __device__ __forceinline__ static void compute_stage_folded(const uint8_t* st, Acc& acc) {
    uint4 words[kNTW];
    uint2 scl[kNTW];
    load_weight_fragments(st, words, scl);
    const int lane = threadIdx.x % 32;
    const uint8_t* sx = st + kWBytes + kSBytes;

#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t b[kTT][4];
      float bias[kTT][4];
#pragma unroll
      for (int i = 0; i < kTT; ++i) {
        const int r = i * 8 + (lane & 7);
        const int ch = 4 * h + (lane >> 3);
        ldmatrix_x4(b[i], sx + r * 128 + ((ch ^ (r & 7)) * 16));
        fold_bias(b[i], bias[i]);
      }
#pragma unroll
      for (int j = 0; j < kNTW; ++j) fold_group(words[j], h == 0 ? scl[j].x : scl[j].y, h, b, bias, acc[j]);
    }
  }

  // The MMAs of one landed ring stage `st` (weights, scales, activations of one K block) into acc.
  __device__ __forceinline__ static void compute_stage(const uint8_t* st, Acc& acc) {
    uint4 words[kNTW];
    uint2 scl[kNTW];
    load_weight_fragments(st, words, scl);
    const int lane = threadIdx.x % 32;
    const uint8_t* sx = st + kWBytes + kSBytes;

#pragma unroll
    for (int h = 0; h < 2; ++h) {  // two 32-wide halves = two scale groups
      uint32_t b[kTT][4];
#pragma unroll
      for (int i = 0; i < kTT; ++i) {
        const int r = i * 8 + (lane & 7);
        const int ch = 4 * h + (lane >> 3);
        ldmatrix_x4(b[i], sx + r * 128 + ((ch ^ (r & 7)) * 16));
      }
#pragma unroll
      for (int j = 0; j < kNTW; ++j) {
        dequant_group(words[j], h == 0 ? scl[j].x : scl[j].y, h, [&](int ss2, const uint32_t (&a)[4]) {
          if constexpr (SWAP) {
#pragma unroll
            for (int i = 0; i < kTT; ++i) mma_bf16_m16n8k16(acc[j][i], a, b[i][2 * ss2], b[i][2 * ss2 + 1]);
          } else {
            // The weight fragment's {a0, a2} / {a1, a3} are the k16 x n8 B operands of
            // features 0-7 / 8-15; two 8-token fragments make one 16-token A operand.
#pragma unroll
            for (int u = 0; u < kTT / 2; ++u) {
              const uint32_t t[4] = {b[2 * u][2 * ss2], b[2 * u + 1][2 * ss2], b[2 * u][2 * ss2 + 1],
                                     b[2 * u + 1][2 * ss2 + 1]};
              mma_bf16_m16n8k16(acc[j][2 * u], t, a[0], a[2]);
              mma_bf16_m16n8k16(acc[j][2 * u + 1], t, a[1], a[3]);
            }
          }
        });
      }
    }
  }

  // Ring position g of `total`: wait for its stage (stage g-1 is then free for everyone), refill
  // that slot STAGES-1 positions ahead, and run stage g's MMAs.
  template <class LoadNext>
  __device__ __forceinline__ static void ring_step(int g, int total, LoadNext&& load_next, uint8_t* smem, Acc& acc) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (g == 0) CHORD_STAMP_MIN(kStampFirstClk);
    const int next = g + STAGES - 1;
    if (next < total) load_next(next % STAGES);
    cp_async_commit();
    if constexpr (FOLD) {
      compute_stage_folded(smem + (g % STAGES) * kStageBytes, acc);
    } else {
      compute_stage(smem + (g % STAGES) * kStageBytes, acc);
    }
  }

  // Accumulates K blocks [kb_begin, kb_end) of expert `expert` for NTILES consecutive N blocks
  // from `n_block`, one after the other through one ring (the loads run ahead across tile
  // boundaries), and calls epilogue(t, acc) after tile t. `in_row[r]` (shared): input row of
  // tile row r, or -1 (zero-filled, never read). NTILES == 1: the epilogue runs after the ring
  // has drained (it may reuse the ring's shared memory); NTILES > 1: while the next tile's
  // copies are in flight (its shared memory lies after the ring).
  template <int NTILES, class Epilogue>
  __device__ __forceinline__ static void run(const GemmParams& p, int expert, int n_block,
                                             const int64_t* __restrict__ in_row, int kb_begin, int kb_end,
                                             uint8_t* smem, Acc& acc, Epilogue&& epilogue) {
    const int tid = threadIdx.x;
    const int K = static_cast<int>(p.k);
    const int KB = kb_end - kb_begin;
    const uint64_t evict_first = make_evict_first_policy();

    // Per-thread copy assignments, computed once per tile: each K block only adds kb times the
    // layout's stride to the sources (common/params.cuh, Swap16Layout).
    constexpr int T = kThreads;
    const Swap16Layout<kNTiles> lay(p, expert);
    const int wstep = lay.group() * 32;  // uint4 from one K block of a tile to the next
    const int sstep = lay.group() * 64;  // bytes
    const uint32_t smem_base = smem_u32(smem);
    const uint4* wsrc[kWIters];
    const uint8_t* ssrc[kSIters];
    const __nv_bfloat16* xsrc[kXIters];
    uint32_t xdst[kXIters];
    bool xvalid[kXIters];
    // Points the weight and scale sources at K block kb_begin of tile `tile` (relative to the
    // first; the activation rows are the same for every tile).
    auto aim = [&](int tile) {
      const int t0 = (n_block + tile) * kNTiles;
#pragma unroll
      for (int it = 0; it < kWIters; ++it) {
        const int c = tid + it * T;
        wsrc[it] = p.qweight + lay.block(t0 + c / 32, kb_begin) * 32 + (c % 32);
      }
#pragma unroll
      for (int it = 0; it < kSIters; ++it) {
        const int c = tid + it * T;
        ssrc[it] = reinterpret_cast<const uint8_t*>(p.scales + lay.block(t0 + c / 4, kb_begin) * 8) + (c % 4) * 16;
      }
    };
    aim(0);
#pragma unroll
    for (int it = 0; it < kXIters; ++it) {
      const int c = tid + it * T;
      const int r = (c / 8) % BT, ch = c % 8;
      const int64_t row = in_row[r];
      xvalid[it] = row >= 0 && c < kXChunks;
      xsrc[it] = p.x + (row >= 0 ? row * K + kb_begin * kKBlock + ch * 8 : 0);
      xdst[it] = x_offset(r, ch);
    }

    // Copies K block kb of the aimed tile into ring slot s.
    auto load_stage = [&](int s, int kb) {
      copy_stage(smem_base + s * kStageBytes, wsrc, ssrc, xsrc, xdst, xvalid, kb, wstep, sstep, evict_first);
    };
    // The loads come in order, N block by N block: the next one is K block l_kb of tile l_tile.
    int l_tile = 0, l_kb = 0;
    const int TOTAL = KB * NTILES;
    auto load_next = [&](int slot) {
      load_stage(slot, l_kb);
      if (++l_kb == KB) {
        l_kb = 0;
        if constexpr (NTILES > 1) {
          if constexpr (Swap16Layout<kNTiles>::kFixed) {
#pragma unroll
            for (int it = 0; it < kWIters; ++it) wsrc[it] += lay.next_n_block(0) * 32;  // the sources stay at the tile's first K block
#pragma unroll
            for (int it = 0; it < kSIters; ++it) ssrc[it] += lay.next_n_block(0) * 64;
          } else if (++l_tile < NTILES) {
            aim(l_tile);
          }
        }
      }
    };

    // Prologue: STAGES-1 k-blocks in flight.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < TOTAL) load_next(s);
      cp_async_commit();
    }

    for (int tile = 0; tile < NTILES; ++tile) {
      zero_acc(acc);
      for (int kb = 0; kb < KB; ++kb) ring_step(tile * KB + kb, TOTAL, load_next, smem, acc);
      if constexpr (NTILES > 1) epilogue(tile, acc);  // its shared memory lies after the ring
    }
    cp_async_wait<0>();
    __syncthreads();  // every read of the pipeline's shared memory is done (the epilogue reuses it)
    if constexpr (NTILES == 1) epilogue(0, acc);
  }

  // Stream-K (moe/stream_k.cuh): units [plan.u0, plan.u1) in order, one continuous ring across
  // tiles, token blocks and experts. The loads run STAGES-1 units ahead; when they enter a token
  // block, the row source (StreamKRowSource: this loop reads no routing itself) gives each
  // activation chunk its input row. A block without a local expert loads nothing (its MMAs run
  // on stale shared memory and are never stored). After the last unit of each
  // segment, epilogue(t, seg_begin, seg_end, b & 1, acc) runs while the next units' copies are in
  // flight (its shared memory lies after the ring).
  template <class Plan, class Rows, class Epilogue>
  __device__ __forceinline__ static void run_stream(const GemmParams& p, const Plan& plan, Rows& rows, uint8_t* smem,
                                                    Acc& acc, Epilogue&& epilogue) {
    const int tid = threadIdx.x;
    const int K = static_cast<int>(p.k);
    const int KB = plan.KB, Y = plan.Y;
    const int TOTAL = plan.u1 - plan.u0;
    const uint64_t evict_first = make_evict_first_policy();
    constexpr int T = kThreads;
    const int wstep = Swap16Layout<kNTiles>(p, 0).group() * 32;  // G depends on N only
    const int sstep = wstep * 2;
    const uint32_t smem_base = smem_u32(smem);
    const uint4* wsrc[kWIters];
    const uint8_t* ssrc[kSIters];
    const __nv_bfloat16* xsrc[kXIters];
    uint32_t xdst[kXIters];
    bool xvalid[kXIters];
#pragma unroll
    for (int it = 0; it < kXIters; ++it) {
      const int c = tid + it * T;
      const int r = (c / 8) % BT, ch = c % 8;
      xdst[it] = x_offset(r, ch);
    }
    // Points the loads at tile t (K block 0; each K block adds kb strides).
    auto aim = [&](int t) {
      const int b = t / Y;
      const int nb = t - b * Y;
      if (b != rows.block()) {
        rows.enter(p, plan, b, [&](int it, bool valid, int64_t in_row) {
          const int ch = (tid + it * T) % 8;
          xvalid[it] = valid;
          xsrc[it] = p.x + (valid ? in_row * K + ch * 8 : 0);
        });
      }
      if (rows.expert() < 0) return;
      const Swap16Layout<kNTiles> lay(p, rows.expert());
      const int t0 = nb * kNTiles;
#pragma unroll
      for (int it = 0; it < kWIters; ++it) {
        const int c = tid + it * T;
        wsrc[it] = p.qweight + lay.block(t0 + c / 32, 0) * 32 + (c % 32);
      }
#pragma unroll
      for (int it = 0; it < kSIters; ++it) {
        const int c = tid + it * T;
        ssrc[it] = reinterpret_cast<const uint8_t*>(p.scales + lay.block(t0 + c / 4, 0) * 8) + (c % 4) * 16;
      }
    };
    int l_t = plan.u0 / KB;  // the next load: K block l_kb of tile l_t
    int l_kb = plan.u0 - l_t * KB;
    aim(l_t);
    auto load_next = [&](int slot) {
      if (rows.expert() >= 0)
        copy_stage(smem_base + slot * kStageBytes, wsrc, ssrc, xsrc, xdst, xvalid, l_kb, wstep, sstep, evict_first);
      if (++l_kb == KB) {
        l_kb = 0;
        if (++l_t * KB < plan.u1) aim(l_t);
      }
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < TOTAL) load_next(s);
      cp_async_commit();
    }
    int c_t = plan.u0 / KB;  // the unit computed: K block c_kb of tile c_t (the loads are ahead by now)
    int c_kb = plan.u0 - c_t * KB;
    int seg_begin = plan.u0;
    for (int g = 0; g < TOTAL; ++g) {
      if (g == 0 || c_kb == 0) zero_acc(acc);
      ring_step(g, TOTAL, load_next, smem, acc);
      if (c_kb == KB - 1 || g == TOTAL - 1) {
        const int seg_end = plan.u0 + g + 1;
        epilogue(c_t, seg_begin, seg_end, (c_t / Y) & 1, acc);
        seg_begin = seg_end;
      }
      if (++c_kb == KB) {
        c_kb = 0;
        ++c_t;
      }
    }
    cp_async_wait<0>();
    __syncthreads();
  }
};

}  // namespace chord

// Main loop `mma` with direct = 1: warp-private rings, for the few-row GEMMs whose time is
// latency, not arithmetic (TP8 one token: 8 experts x 1 row, where each CTA of the multistage
// loop walks 4-14 K blocks through a ring it mostly fills and drains, a CTA barrier per block).
//
// The CTA's WARPS warps split its K range [kb_begin, kb_end) evenly, and each walks its share for
// all BN/16 weight tiles of the N block through its own STAGES-deep cp.async ring in shared
// memory: no CTA barrier in the K loop, a warp waits only for its own copy groups
// (cp.async.wait_group, then __syncwarp for the rows its lanes copied for each other). Per K
// block a lane copies its own 16-byte swap16 word of each tile (its A fragments of that 16x16
// tile, read back by itself), lanes 0..4*BN/16-1 the N block's scales (one contiguous run of
// BN/16 x 64 bytes), and each lane two 16-byte chunks of one activation row per 8-token group.
// Weights and scales stream evict-first. (Plain loads into a register ring do not pipeline:
// ptxas puts every load of the ring on one scoreboard, so consuming the oldest K block waits for
// the newest.) A K block is dequantized and fed to mma.sync.m16n8k16 (the operand swap's tokens
// on N) as in MmaSwap16, with or without folded group scales (fold). After the loop the warps'
// fp32 partials meet once in shared memory and warp m (m < kMmaWarps) sums tiles m*kNTW.. over
// the warps in warp order (deterministic) into the accumulator layout of moe/epilogue.cuh, so the
// epilogue and split-K (workspace or cluster) are the other loops' own.
//
// The bits differ from MmaSwap16's (each warp's K share is a separate fp32 partial); they are the
// same from run to run and checked against the float32 reference.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "../common/dequant.cuh"
#include "../common/params.cuh"
#include "../common/ptx.cuh"
#include "../common/stamps.cuh"

namespace chord {

// Cfg: the schedule's configuration struct (chord.jit.render_config); this part reads block_m,
// block_n, warps, stages (each warp's ring) and fold.
template <class Cfg>
struct MmaDirect {
  static constexpr int BT = Cfg::kBlockM;
  static constexpr int BN = Cfg::kBlockN;
  static constexpr int WARPS = Cfg::kWarps;
  static constexpr int STAGES = Cfg::kStages;
  static constexpr bool FOLD = Cfg::kFold;  // scales on fp32 partials per 32-K group (common/dequant.cuh fold_group)
  static_assert(Cfg::kSwap && !Cfg::kProducer, "direct main loop: the operand swap, no producer warp");
  static_assert(BT % 8 == 0 && BT >= 8 && BT <= 32, "direct main loop: BT multiple of 8 in [8, 32]");
  static constexpr int kNTiles = BN / 16;  // 16-row weight tiles of the N block (every warp walks all of them)
  static_assert(BN % 16 == 0 && kNTiles >= 1 && kNTiles <= 8 && (kNTiles & (kNTiles - 1)) == 0,
                "direct main loop: BN in {16, 32, 64, 128}");
  static_assert(STAGES >= 2 && STAGES <= 12, "direct main loop: a ring of 2-12 K blocks per warp");
  static constexpr bool kSwapped = true;  // the accumulator layout the epilogue reads (moe/epilogue.cuh)
  static constexpr int kThreads = WARPS * 32;
  static constexpr int kMmaWarps = WARPS < kNTiles ? WARPS : kNTiles;  // warps holding the summed tiles
  static_assert(kNTiles % kMmaWarps == 0, "direct main loop: the summed tiles split evenly over the warps");
  static constexpr int kNTW = kNTiles / kMmaWarps;  // summed tiles per such warp
  static constexpr int kEpilogueThreads = kThreads;  // every thread runs the epilogue
  static constexpr int kTT = BT / 8;                 // 8-token MMA tiles
  static constexpr int kXIters = 0;                  // no CTA copy plan (stream-K is the multistage loop's)
  // One warp's ring slot: the lanes' words, the N block's scales, the token rows (144-byte rows:
  // the lanes' 32-bit B-fragment reads of one k16 step fall in 32 different banks).
  static constexpr int kXRow = kKBlock * 2 + 16;
  static constexpr int kWBytes = kNTiles * 32 * 16;
  static constexpr int kSBytes = kNTiles * 64;
  static constexpr int kXBytes = BT * kXRow;
  static constexpr int kSlotBytes = kWBytes + kSBytes + kXBytes;
  static constexpr int kRingBytes = WARPS * STAGES * kSlotBytes;
  static constexpr int kPartBytes = WARPS > 1 ? WARPS * kNTiles * kTT * 32 * 16 : 0;  // the warps' partials
  static constexpr int kSmemBytes = kRingBytes > kPartBytes ? kRingBytes : kPartBytes;  // (the epilogue reuses it)
  static constexpr int kAlign = 128;
  static_assert(kSlotBytes % 16 == 0, "direct main loop: 16-byte aligned slots");

  // acc[j][i]: the m16n8 tile (16 features of tile warp * kNTW + j) x (tokens 8i..8i+7)
  using Acc = float[kNTW][kTT][4];
  using Part = float[kNTiles][kTT][4];  // one warp's partial over its K share, every tile

  // The copies of K block `kb` (counted from the warp's first) into the slot at shared address
  // `sl`: copy_weights, each lane its words and lanes 0..4*kNTiles-1 a 16-byte scale chunk;
  // copy_rows, each lane chunks t and t + 4 of row i*8 + g of every 8-token group i (zeros for a
  // padding row); copy, both.
  __device__ __forceinline__ static void copy_weights(uint32_t sl, const uint4* w, const uint8_t* s, int64_t wstep,
                                                      int64_t sstep, int kb, uint64_t policy) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) cp_async_16_stream_u32(sl + (j * 32 + lane) * 16, w + kb * wstep + j * 32, policy);
    if (kNTiles * 4 == 32 || lane < kNTiles * 4)
      cp_async_16_stream_u32(sl + kWBytes + lane * 16, s + kb * sstep + lane * 16, policy);
  }
  __device__ __forceinline__ static void copy_rows(uint32_t sl, const __nv_bfloat16* const (&xrow)[kTT],
                                                   const bool (&xvalid)[kTT], uint32_t xdst, int kb) {
#pragma unroll
    for (int i = 0; i < kTT; ++i) {
      const uint32_t d = sl + kWBytes + kSBytes + i * 8 * kXRow + xdst;
      cp_async_16_u32(d, xrow[i] + kb * kKBlock, xvalid[i]);
      cp_async_16_u32(d + 64, xrow[i] + kb * kKBlock + 32, xvalid[i]);
    }
  }
  __device__ __forceinline__ static void copy(uint32_t sl, const uint4* w, const uint8_t* s, int64_t wstep,
                                              int64_t sstep, const __nv_bfloat16* const (&xrow)[kTT],
                                              const bool (&xvalid)[kTT], uint32_t xdst, int kb, uint64_t policy) {
    copy_weights(sl, w, s, wstep, sstep, kb, policy);
    copy_rows(sl, xrow, xvalid, xdst, kb);
  }

  // This warp's K blocks [w0, w0 + n) of the CTA's range, and where its words and scales of the N
  // block's first tile t0 start (the N block's tiles t0.. lie at consecutive places of one tile
  // group: G >= BN/16 because BN divides N, and t0 is a multiple of BN/16, so tile j's block is
  // block(t0, kb) + j and the scales of one K block are one run).
  struct Share {
    int w0, n;
    int64_t wstep, sstep;  // uint4 / bytes from one K block of a tile to the next
    const uint4* wsrc;
    const uint8_t* ssrc;
    __device__ __forceinline__ Share(const GemmParams& p, int expert, int n_block, int kb_begin, int kb_end) {
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      const int KB = kb_end - kb_begin;
      w0 = kb_begin + (KB * warp) / WARPS;
      n = kb_begin + (KB * (warp + 1)) / WARPS - w0;
      const Swap16Layout<kNTiles> lay(p, expert);
      wstep = static_cast<int64_t>(lay.group()) * 32;
      sstep = static_cast<int64_t>(lay.group()) * 64;
      const int64_t b0 = lay.block(n_block * kNTiles, w0);
      wsrc = p.qweight + b0 * 32 + lane;
      ssrc = reinterpret_cast<const uint8_t*>(p.scales + b0 * 8);
    }
  };

  // PDL that prefetches (Cfg::kPdlPrefetch, moe/prefetch.cuh WarpRingPrefetch): before
  // griddepcontrol.wait, the expert this CTA will likely work on (a guess from the routing as it
  // reads then, the same in every lane, -1: none) is recorded for the warp, and the words and
  // scales of its ring's first STAGES - 1 K blocks of that expert (constant bytes) are copied as
  // STAGES - 1 groups. run() keeps them when the routing read after the wait names the same
  // expert, and otherwise lets them land before it fills the ring again.
  static constexpr bool kEarlyCopies = true;
  __device__ __forceinline__ static int* early_guess() {
    __shared__ int guess[WARPS];
    return guess;
  }
  __device__ __forceinline__ static void early_copies(const GemmParams& p, int expert, int n_block, int kb_begin,
                                                      int kb_end) {
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) early_guess()[warp] = expert;
    if (expert < 0) return;  // uniform across the warp
    extern __shared__ __align__(128) uint8_t smem_raw[];  // MoeKernel's dynamic shared memory (kAlign 128: unshifted)
    const Share sh(p, expert, n_block, kb_begin, kb_end);
    const uint64_t policy = make_evict_first_policy();
    const uint32_t ring = smem_u32(smem_raw) + warp * STAGES * kSlotBytes;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < sh.n) copy_weights(ring + s * kSlotBytes, sh.wsrc, sh.ssrc, sh.wstep, sh.sstep, s, policy);
      cp_async_commit();
    }
  }

  // The MMAs of one landed slot into the warp's partial (the order of MmaSwap16's compute_stage:
  // scale group, tile, k16 step, token tile; FOLD: its compute_stage_folded's).
  __device__ __forceinline__ static void compute(const uint8_t* sl, Part& part) {
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4;
    uint4 words[kNTiles];
    uint2 scl[kNTiles];
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      words[j] = reinterpret_cast<const uint4*>(sl)[j * 32 + lane];
      scl[j] = reinterpret_cast<const uint2*>(sl + kWBytes)[j * 8 + g];
    }
    const uint8_t* sx = sl + kWBytes + kSBytes + g * kXRow + t4 * 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t b[kTT][4];  // k16 steps 2h, 2h + 1: {k lo, k hi} each
#pragma unroll
      for (int i = 0; i < kTT; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q)
          b[i][q] = *reinterpret_cast<const uint32_t*>(sx + i * 8 * kXRow + (2 * h + q / 2) * 32 + (q % 2) * 16);
      if constexpr (FOLD) {
        float bias[kTT][4];
#pragma unroll
        for (int i = 0; i < kTT; ++i) fold_bias(b[i], bias[i]);
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) fold_group(words[j], h == 0 ? scl[j].x : scl[j].y, h, b, bias, part[j]);
      } else {
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          dequant_group(words[j], h == 0 ? scl[j].x : scl[j].y, h, [&](int ss2, const uint32_t (&a)[4]) {
#pragma unroll
            for (int i = 0; i < kTT; ++i) mma_bf16_m16n8k16(part[j][i], a, b[i][2 * ss2], b[i][2 * ss2 + 1]);
          });
        }
      }
    }
  }

  // Accumulates K blocks [kb_begin, kb_end) of expert `expert`, N block `n_block`, and calls
  // epilogue(0, acc) once (every thread; the shared memory is free again by then). `in_row[r]`
  // (shared): input row of tile row r, or -1 (zeros, never read).
  template <int NTILES, class Epilogue>
  __device__ __forceinline__ static void run(const GemmParams& p, int expert, int n_block,
                                             const int64_t* __restrict__ in_row, int kb_begin, int kb_end,
                                             uint8_t* smem, Acc& acc, Epilogue&& epilogue) {
    static_assert(NTILES == 1, "direct main loop: one N block per CTA");
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int64_t K = p.k;
    const uint64_t policy = make_evict_first_policy();
    const Share sh(p, expert, n_block, kb_begin, kb_end);
    const int w0 = sh.w0, n = sh.n;
    const uint4* wsrc = sh.wsrc;
    const uint8_t* ssrc = sh.ssrc;
    const int64_t wstep = sh.wstep, sstep = sh.sstep;
    const __nv_bfloat16* xrow[kTT];
    bool xvalid[kTT];
#pragma unroll
    for (int i = 0; i < kTT; ++i) {
      const int64_t row = in_row[i * 8 + g];
      xvalid[i] = row >= 0;
      xrow[i] = p.x + (row >= 0 ? row * K + static_cast<int64_t>(w0) * kKBlock + t4 * 8 : 0);
    }
    const uint32_t xdst = static_cast<uint32_t>(g * kXRow + t4 * 16);
    uint8_t* ring = smem + warp * STAGES * kSlotBytes;
    const uint32_t ring_u32 = smem_u32(ring);

    bool early = false;  // the weights of the first STAGES - 1 K blocks are in flight already (early_copies)
    if constexpr (Cfg::kPdlPrefetch) {
      const int guess = early_guess()[warp];  // written before the wait, published by the CTA's barrier since
      early = guess == expert;
      if (!early && guess >= 0) cp_async_wait<0>();  // a wrong guess: its copies land before the slots are refilled
    }
    if (early) {  // the same K blocks' rows, one group each (the waits below count these groups)
#pragma unroll
      for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n) copy_rows(ring_u32 + s * kSlotBytes, xrow, xvalid, xdst, s);
        cp_async_commit();
      }
    } else {
#pragma unroll
      for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n) copy(ring_u32 + s * kSlotBytes, wsrc, ssrc, wstep, sstep, xrow, xvalid, xdst, s, policy);
        cp_async_commit();
      }
    }
    Part part;
    zero_acc(part);
    for (int kb = 0; kb < n; ++kb) {  // uniform across the warp
      cp_async_wait<STAGES - 2>();
      __syncwarp();  // K block kb has landed for every lane; every lane is done with K block kb - 1
      const int next = kb + STAGES - 1;
      if (next < n)
        copy(ring_u32 + (next % STAGES) * kSlotBytes, wsrc, ssrc, wstep, sstep, xrow, xvalid, xdst, next, policy);
      cp_async_commit();
      compute(ring + (kb % STAGES) * kSlotBytes, part);
      if (kb == 0) CHORD_STAMP_MIN(kStampFirstClk);
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with its ring: the partials may overwrite it

    if constexpr (WARPS == 1) {
#pragma unroll
      for (int j = 0; j < kNTW; ++j)
#pragma unroll
        for (int i = 0; i < kTT; ++i)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[j][i][c] = part[j][i][c];
    } else {
      float4* red = reinterpret_cast<float4*>(smem);
#pragma unroll
      for (int j = 0; j < kNTiles; ++j)
#pragma unroll
        for (int i = 0; i < kTT; ++i)
          red[((warp * kNTiles + j) * kTT + i) * 32 + lane] =
              make_float4(part[j][i][0], part[j][i][1], part[j][i][2], part[j][i][3]);
      __syncthreads();
      if (warp < kMmaWarps) {
#pragma unroll
        for (int jj = 0; jj < kNTW; ++jj) {
          const int j = warp * kNTW + jj;
#pragma unroll
          for (int i = 0; i < kTT; ++i) {
            float4 v = red[(j * kTT + i) * 32 + lane];  // warp 0's partial, then the others in order
#pragma unroll
            for (int w = 1; w < WARPS; ++w) {
              const float4 u = red[((w * kNTiles + j) * kTT + i) * 32 + lane];
              v.x += u.x;
              v.y += u.y;
              v.z += u.z;
              v.w += u.w;
            }
            acc[jj][i][0] = v.x;
            acc[jj][i][1] = v.y;
            acc[jj][i][2] = v.z;
            acc[jj][i][3] = v.w;
          }
        }
      }
    }
    __syncthreads();  // every partial read (or the ring drained): the epilogue may reuse the shared memory
    epilogue(0, acc);
  }
};

}  // namespace chord

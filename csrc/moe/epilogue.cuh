// Epilogue of every main loop: fp32 accumulators -> bf16 tile in shared memory -> 16-byte row
// stores, with the split-K fix-up.
//
// Accumulator layout: warp w owns NTW 16-row weight tiles (output features (w*NTW + j)*16 + ...,
// g = lane/4, t = lane%4) and all the tile's tokens. Swapped (both main loops' default), in
// 8-token groups i: acc[j][i] = {(feature g, token 8i+2t), (g, 8i+2t+1), (g+8, 8i+2t), (g+8, 8i+2t+1)}.
// Unswapped (SWAPPED = false, tokens on the MMA M side), in 16-token groups u and feature halves h:
// acc[j][2u+h] = {(feature 8h+2t, token 16u+g), (8h+2t+1, 16u+g), (8h+2t, 16u+g+8), (8h+2t+1, 16u+g+8)}.
//
// SPLIT > 1: partial fp32 tiles meet in `workspace`; the last CTA of the tile to arrive (counted
// in `counters`, reset to 0 by that CTA so CUDA-graph replays start clean) sums them in z order
// (deterministic) and stores the bf16 rows. Threads 0..THREADS-1 call it (ALL: every thread
// of the CTA; else the others have exited). The caller has finished every read of `smem` by the
// main loop (all MMAs retired, a CTA barrier) before calling.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "../common/params.cuh"

namespace chord {

template <int BT, int BN>
struct EpilogueConfig {
  static constexpr int kCStride = BN + 8;  // bf16 elements per staged row (+16 B: no bank conflicts)
  static constexpr int kSmemBytes = BT * kCStride * 2;
};

// Barrier over the first THREADS threads: the whole CTA (ALL) or a named barrier of the warps
// that run the epilogue (a producer warpgroup has left by then).
template <int THREADS, bool ALL>
__device__ __forceinline__ void epilogue_sync() {
  if constexpr (ALL) {
    __syncthreads();
  } else {
    asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
  }
}

template <int BT, int BN, int THREADS, int MMA_WARPS, int NTW, int SPLIT, bool ALL = true, bool SWAPPED = true>
__device__ __forceinline__ void store_tile(const GemmParams& p, const float (&acc)[NTW][BT / 8][4], int n_block,
                                           const int64_t* __restrict__ out_row, uint8_t* smem) {
  using E = EpilogueConfig<BT, BN>;
  constexpr int kTT = BT / 8;
  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int N = static_cast<int>(p.n);
  __nv_bfloat16* sc = reinterpret_cast<__nv_bfloat16*>(smem);

  // One walk over the fragments; `put(tok, feature, value)` is where each value goes. Warps
  // without accumulators (a producer warp) only help with the barriers and the row stores.
  auto walk = [&](auto&& put) {
    if (warp >= MMA_WARPS) return;
#pragma unroll
    for (int j = 0; j < NTW; ++j) {
      if constexpr (SWAPPED) {
        const int n0 = (warp * NTW + j) * 16 + g;
#pragma unroll
        for (int i = 0; i < kTT; ++i) {
          const int tok = i * 8 + 2 * t4;
          put(tok + 0, n0, acc[j][i][0]);
          put(tok + 1, n0, acc[j][i][1]);
          put(tok + 0, n0 + 8, acc[j][i][2]);
          put(tok + 1, n0 + 8, acc[j][i][3]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kTT; ++i) {
          const int n0 = (warp * NTW + j) * 16 + (i % 2) * 8 + 2 * t4;
          const int tok = (i / 2) * 16 + g;
          put(tok, n0, acc[j][i][0]);
          put(tok, n0 + 1, acc[j][i][1]);
          put(tok + 8, n0, acc[j][i][2]);
          put(tok + 8, n0 + 1, acc[j][i][3]);
        }
      }
    }
  };

  if constexpr (SPLIT == 1) {
    walk([&](int tok, int n, float v) { sc[tok * E::kCStride + n] = __float2bfloat16_rn(v); });
  } else {
    __shared__ int s_last;
    const int split_z = static_cast<int>(blockIdx.z);
    const int64_t tile = static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y;
    float* part = p.workspace + (tile * SPLIT + split_z) * (BT * BN);
    walk([&](int tok, int n, float v) { __stcg(part + tok * BN + n, v); });
    __threadfence();
    epilogue_sync<THREADS, ALL>();
    if (tid == 0) s_last = atomicAdd(p.counters + tile, 1) == SPLIT - 1;
    epilogue_sync<THREADS, ALL>();
    if (!s_last) return;  // uniform: another CTA of this tile finishes it
    __threadfence();
    const float* base = p.workspace + tile * SPLIT * (BT * BN);
    for (int e = tid; e < BT * BN; e += THREADS) {
      float v = 0.f;
#pragma unroll
      for (int z = 0; z < SPLIT; ++z) v += __ldcg(base + z * (BT * BN) + e);
      sc[(e / BN) * E::kCStride + (e % BN)] = __float2bfloat16_rn(v);
    }
    if (tid == 0) p.counters[tile] = 0;  // ready for the next launch (and CUDA-graph replays)
  }
  epilogue_sync<THREADS, ALL>();
  constexpr int kChunksPerRow = BN / 8;
#pragma unroll
  for (int c = tid; c < BT * kChunksPerRow; c += THREADS) {
    const int r = c / kChunksPerRow, ch = c % kChunksPerRow;
    const int64_t row = out_row[r];
    if (row < 0) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(sc + r * E::kCStride + ch * 8);
    *reinterpret_cast<uint4*>(p.out + row * N + static_cast<int64_t>(n_block) * BN + ch * 8) = v;
  }
}

}  // namespace chord

// Epilogue of every main loop: fp32 accumulators -> bf16 tile in shared memory -> 16-byte row
// stores, with the split-K fix-up.
//
// Accumulator layout: warp w owns NTW 16-row weight tiles (output features (w*NTW + j)*16 + ...,
// g = lane/4, t = lane%4) and all the tile's tokens. Swapped (both main loops' default), in
// 8-token groups i: acc[j][i] = {(feature g, token 8i+2t), (g, 8i+2t+1), (g+8, 8i+2t), (g+8, 8i+2t+1)}.
// Unswapped (SWAPPED = false, tokens on the MMA M side), in 16-token groups u and feature halves h:
// acc[j][2u+h] = {(feature 8h+2t, token 16u+g), (8h+2t+1, 16u+g), (8h+2t, 16u+g+8), (8h+2t+1, 16u+g+8)}.
//
// STMATRIX (swapped layout, SPLIT == 1): each warp moves its fragments to the staged tile with
// `stmatrix.trans`, one instruction per two 8-token groups of a 16-feature tile (the C fragment
// of a group is two 8x8 matrices, features x tokens, stored transposed as token rows); else one
// 16-bit shared store per value. The bf16 values, hence the output bits, are the same.
//
// SPLIT > 1 with SPLIT_CLUSTER: the tile's SPLIT CTAs are one cluster; each leaves its fp32
// partial in its own shared memory and, after a cluster barrier, sums every CTA's partial of its
// share of the 16-byte output chunks through distributed shared memory, in z order (the bits of
// the workspace fix-up), and stores them; a second barrier keeps every CTA's shared memory alive
// until the last read.
// SPLIT > 1 otherwise: partial fp32 tiles meet in `workspace`; the last CTA of the tile to arrive (counted
// in `counters`, reset to 0 by that CTA so CUDA-graph replays start clean) sums them in z order
// (deterministic) and stores the bf16 rows. Threads 0..THREADS-1 call it (ALL: every thread
// of the CTA; else the others have exited). The caller has finished every read of `smem` by the
// main loop (all MMAs retired, a CTA barrier) before calling.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "../common/params.cuh"
#include "../common/ptx.cuh"
#include "../common/stamps.cuh"

namespace chord {

template <int BT, int BN>
struct EpilogueConfig {
  static constexpr int kCStride = BN + 8;  // bf16 elements per staged row (+16 B: no bank conflicts)
  static constexpr int kSmemBytes = BT * kCStride * 2;
};

// One walk over a thread's accumulator fragments (the layouts above): put(tok, feature, value)
// is where each value goes. Warps without accumulators (a producer warp) have none.
template <int BT, int MMA_WARPS, int NTW, bool SWAPPED, class Put>
__device__ __forceinline__ void for_each_acc(const float (&acc)[NTW][BT / 8][4], Put&& put) {
  constexpr int kTT = BT / 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
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
}

// The staged bf16 tile (BT rows of kCStride) to its output rows, 16 bytes at a time; rows < 0
// (padding) are skipped. Threads 0..THREADS-1 call it after the tile is staged and published.
template <int BT, int BN, int THREADS>
__device__ __forceinline__ void store_rows(const GemmParams& p, const __nv_bfloat16* sc, int n_block,
                                           const int64_t* __restrict__ out_row) {
  using E = EpilogueConfig<BT, BN>;
  constexpr int kChunksPerRow = BN / 8;
  const int N = static_cast<int>(p.n);
#pragma unroll
  for (int c = threadIdx.x; c < BT * kChunksPerRow; c += THREADS) {
    const int r = c / kChunksPerRow, ch = c % kChunksPerRow;
    const int64_t row = out_row[r];
    if (row < 0) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(sc + r * E::kCStride + ch * 8);
    *reinterpret_cast<uint4*>(p.out + row * N + static_cast<int64_t>(n_block) * BN + ch * 8) = v;
  }
}

template <int BT, int BN, int THREADS, int MMA_WARPS, int NTW, int SPLIT, bool ALL = true, bool SWAPPED = true,
          bool STMATRIX = true, bool SPLIT_CLUSTER = false>
__device__ __forceinline__ void store_tile(const GemmParams& p, const float (&acc)[NTW][BT / 8][4], int n_block,
                                           const int64_t* __restrict__ out_row, uint8_t* smem) {
  using E = EpilogueConfig<BT, BN>;
  constexpr int kTT = BT / 8;
  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  __nv_bfloat16* sc = reinterpret_cast<__nv_bfloat16*>(smem);

  auto walk = [&](auto&& put) { for_each_acc<BT, MMA_WARPS, NTW, SWAPPED>(acc, put); };

  if constexpr (SPLIT == 1 && SWAPPED && STMATRIX) {
    if (warp < MMA_WARPS) {
      // lane -> the row address of matrix lane/8 (m % 2: feature half, m / 2: which token group)
      const int m = lane / 8, r = lane % 8;
      const uint32_t base = smem_u32(sc);
      auto pack = [](float lo, float hi) { return as_u32(__floats2bfloat162_rn(lo, hi)); };
#pragma unroll
      for (int j = 0; j < NTW; ++j) {
        const int n0 = (warp * NTW + j) * 16 + (m % 2) * 8;
#pragma unroll
        for (int i = 0; i + 1 < kTT; i += 2) {
          const uint32_t addr = base + static_cast<uint32_t>(((i + m / 2) * 8 + r) * E::kCStride + n0) * 2u;
          stmatrix_x4_trans(addr, pack(acc[j][i][0], acc[j][i][1]), pack(acc[j][i][2], acc[j][i][3]),
                            pack(acc[j][i + 1][0], acc[j][i + 1][1]), pack(acc[j][i + 1][2], acc[j][i + 1][3]));
        }
        if constexpr (kTT % 2) {  // the last, odd 8-token group: two matrices (lanes 0-15 address them)
          constexpr int i = kTT - 1;
          const uint32_t addr = base + static_cast<uint32_t>((i * 8 + r) * E::kCStride + n0) * 2u;
          stmatrix_x2_trans(addr, pack(acc[j][i][0], acc[j][i][1]), pack(acc[j][i][2], acc[j][i][3]));
        }
      }
    }
  } else if constexpr (SPLIT == 1) {
    walk([&](int tok, int n, float v) { sc[tok * E::kCStride + n] = __float2bfloat16_rn(v); });
  } else if constexpr (SPLIT_CLUSTER) {
    static_assert(SPLIT >= 2 && SPLIT <= 8 && ALL, "SPLIT_CLUSTER: a cluster of 2-8 CTAs whose every thread stores");
    static_assert(BN % 8 == 0, "SPLIT_CLUSTER: the fix-up sums 8 features (one 16-byte output chunk) at a time");
    float* mine = reinterpret_cast<float*>(smem);  // this CTA's fp32 partial, [BT][BN]
    walk([&](int tok, int n, float v) { mine[tok * BN + n] = v; });
    cluster_sync();  // every partial of the tile is in its CTA's shared memory
    // Clusters are 1 x 1 x SPLIT over a grid of depth SPLIT: rank zz is the CTA of blockIdx.z zz.
    const int z = static_cast<int>(cluster_ctarank());
    const uint32_t base = smem_u32(mine);
    constexpr int kChunksPerRow = BN / 8;
    const int N = static_cast<int>(p.n);
    for (int c = z + SPLIT * tid; c < BT * kChunksPerRow; c += SPLIT * THREADS) {  // CTA z: chunks z mod SPLIT
      const int r = c / kChunksPerRow, ch = c % kChunksPerRow;
      const int64_t row = out_row[r];
      if (row < 0) continue;
      const uint32_t at = base + static_cast<uint32_t>(r * BN + ch * 8) * 4u;
      float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int zz = 0; zz < SPLIT; ++zz) {  // z order from 0, as the workspace fix-up below: the same bits
        const uint32_t remote = mapa_shared(at, static_cast<uint32_t>(zz));
        const float4 lo = ld_shared_cluster_f4(remote);
        const float4 hi = ld_shared_cluster_f4(remote + 16u);
        v[0] += lo.x;
        v[1] += lo.y;
        v[2] += lo.z;
        v[3] += lo.w;
        v[4] += hi.x;
        v[5] += hi.y;
        v[6] += hi.z;
        v[7] += hi.w;
      }
      const uint4 o = make_uint4(as_u32(__floats2bfloat162_rn(v[0], v[1])), as_u32(__floats2bfloat162_rn(v[2], v[3])),
                                 as_u32(__floats2bfloat162_rn(v[4], v[5])), as_u32(__floats2bfloat162_rn(v[6], v[7])));
      *reinterpret_cast<uint4*>(p.out + row * N + static_cast<int64_t>(n_block) * BN + ch * 8) = o;
    }
    // No CTA leaves (taking its shared memory) while another still reads it: every remote value
    // read above fed a store before this arrive, so the reads are done; no fence is needed (and
    // none waits for the output stores).
    cluster_sync_relaxed();
    return;
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
    CHORD_STAMP_CLOCK_T0(kStampFixupClk);
    __threadfence();
    const float* base = p.workspace + tile * SPLIT * (BT * BN);
    static_assert(BN % 4 == 0, "the split-K fix-up sums 4 features at a time");
    for (int e = tid * 4; e < BT * BN; e += THREADS * 4) {  // each value summed in z order (deterministic)
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int z = 0; z < SPLIT; ++z) {
        const float4 w = __ldcg(reinterpret_cast<const float4*>(base + z * (BT * BN) + e));
        v.x += w.x;
        v.y += w.y;
        v.z += w.z;
        v.w += w.w;
      }
      __nv_bfloat162* d = reinterpret_cast<__nv_bfloat162*>(sc + (e / BN) * E::kCStride + (e % BN));
      d[0] = __floats2bfloat162_rn(v.x, v.y);
      d[1] = __floats2bfloat162_rn(v.z, v.w);
    }
    if (tid == 0) p.counters[tile] = 0;  // ready for the next launch (and CUDA-graph replays)
  }
  epilogue_sync<THREADS, ALL>();
  store_rows<BT, BN, THREADS>(p, sc, n_block, out_row);
}

}  // namespace chord

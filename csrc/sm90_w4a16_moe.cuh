// A W4A16 MoE GEMM kernel put together from its parts:
//   family (row source: indexed / grouped_contiguous / grouped_masked, moe/rows.cuh)
//   x main loop (MmaSwap16: cp.async + mma.sync; WgmmaSwap64: cp.async + wgmma, multistage or
//     with a producer warp and mbarriers; mainloop/)
//   x tile order (RASTER, moe/rows.cuh) x split-K (SPLIT, moe/epilogue.cuh).
// One CTA computes BT token rows x BN output features of one expert:
//   out[row, n] = sum_k x[row, k] * (q[e, n, k] * scale[e, n, k/32])
// This file only composes; chord/jit.py renders one instantiation per Schedule and
// static_asserts the shared-memory size and parameter offsets that Python computed.
#pragma once

#include <cstdint>

#include "common/params.cuh"
#include "mainloop/mma_swap16.cuh"
#include "mainloop/wgmma_swap64.cuh"
#include "moe/epilogue.cuh"
#include "moe/rows.cuh"

namespace chord {

template <int A, int B>
struct MaxOf {
  static constexpr int value = A > B ? A : B;
};

template <Family F, int BT, int BN, class Mainloop, int SPLIT = 1, int RASTER = 0>
struct MoeKernel {
  static_assert(SPLIT >= 1, "SPLIT >= 1");
  static constexpr int kThreads = Mainloop::kThreads;
  // Dynamic shared memory: the pipeline or the epilogue tile, plus the slack that aligning the
  // base to Mainloop::kAlign can cost (the dynamic segment itself is 16-byte aligned).
  static constexpr int kSmemBytes = MaxOf<Mainloop::kSmemBytes, EpilogueConfig<BT, BN>::kSmemBytes>::value +
                                    (Mainloop::kAlign > 128 ? Mainloop::kAlign - 16 : 0);

  __device__ __forceinline__ static void run(const GemmParams& p) {
    extern __shared__ __align__(128) uint8_t smem_raw[];
    __shared__ int64_t in_row[BT];
    __shared__ int64_t out_row[BT];
    __shared__ int s_expert;
    __shared__ int64_t s_first;
    uint8_t* smem = smem_raw;
    if constexpr (Mainloop::kAlign > 128) {
      const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
      smem += (Mainloop::kAlign - (addr % Mainloop::kAlign)) % Mainloop::kAlign;
    }
    const TileCoords tc = tile_coords<RASTER>();
    int e;
    if constexpr (F == Family::kIndexed) {
      e = rows_indexed<BT>(p, tc.m_tile, in_row, out_row);
    } else if constexpr (F == Family::kMasked) {
      e = rows_masked<BT>(p, tc.m_tile, in_row, out_row);
    } else {
      e = rows_contiguous<BT>(p, tc.m_tile, in_row, out_row, &s_expert, &s_first);
    }
    if (e < 0) return;  // uniform across the CTA
    __syncthreads();

    const int kb_all = static_cast<int>(p.k) / kKBlock;
    const int z = SPLIT > 1 ? static_cast<int>(blockIdx.z) : 0;
    const int kb_begin = static_cast<int>((static_cast<int64_t>(kb_all) * z) / SPLIT);
    const int kb_end = static_cast<int>((static_cast<int64_t>(kb_all) * (z + 1)) / SPLIT);
    typename Mainloop::Acc acc;
    if (!Mainloop::run(p, e, tc.n_block, in_row, kb_begin, kb_end, smem, acc)) return;  // a producer warp
    constexpr int kEpi = Mainloop::kEpilogueThreads;
    store_tile<BT, BN, kEpi, Mainloop::kMmaWarps, Mainloop::kNTW, SPLIT, kEpi == kThreads>(p, acc, tc.n_block, out_row,
                                                                                          smem);
  }
};

}  // namespace chord

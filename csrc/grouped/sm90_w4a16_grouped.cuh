// Grouped families (EP path): tokens already permuted per expert.
//  - contiguous: rows of expert e are [expert_offsets[e], expert_offsets[e+1]) (int64, any
//    alignment); grid.x is an upper bound on the number of per-expert row tiles
//    (rows / BT + E), CTAs past the last tile exit.
//  - masked: input [E, max_rows, K] with expert_num_tokens[E]; grid.x = E * ceil(max_rows / BT),
//    tiles at or past an expert's count exit before loading anything, so empty rows cost nothing.
#pragma once

#include "../common/sm90_w4a16_swap16.cuh"

namespace chord {

template <int BT, int BN, int WARPS, int STAGES, int SPLIT = 1>
__device__ __forceinline__ void sm90_w4a16_grouped_contiguous(const GemmParams& p) {
  w4a16_gemm<Family::kContiguous, BT, BN, WARPS, STAGES, SPLIT>(p);
}

template <int BT, int BN, int WARPS, int STAGES, int SPLIT = 1>
__device__ __forceinline__ void sm90_w4a16_grouped_masked(const GemmParams& p) {
  w4a16_gemm<Family::kMasked, BT, BN, WARPS, STAGES, SPLIT>(p);
}

}  // namespace chord

// Indexed family: consumes vLLM's moe_align_block_size routing (sorted_ids / expert_ids /
// num_tokens_post_padded). One CTA = one block of `BT` sorted ids x one `BN` slice of N.
// gate_up reads input row sorted_id / top_k, down (top_k = 1) reads row sorted_id; blocks past
// num_tokens_post_padded and blocks with expert id -1 exit at once.
#pragma once

#include "../common/sm90_w4a16_swap16.cuh"

namespace chord {

template <int BT, int BN, int WARPS, int STAGES, int SPLIT = 1>
__device__ __forceinline__ void sm90_w4a16_indexed(const GemmParams& p) {
  w4a16_gemm<Family::kIndexed, BT, BN, WARPS, STAGES, SPLIT>(p);
}

// Grid: x = blocks of the (possibly over-allocated) sorted_ids buffer, y = N / BN.
inline dim3 indexed_grid(int64_t num_blocks, int64_t n, int bn) {
  return dim3(static_cast<unsigned>(num_blocks), static_cast<unsigned>(n / bn), 1);
}

}  // namespace chord

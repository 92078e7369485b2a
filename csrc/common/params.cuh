// The one parameter block of every W4A16 MoE kernel, and the facts Python must agree with.
//
// The host packs GemmParams with a fixed layout (8 pointers, 8 int64, 2 pointers; see
// chord/jit.py `pack_gemm_params`); every rendered translation unit static_asserts the field
// offsets Python used, so the two can never drift.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_bf16.h>

namespace chord {

constexpr int kKBlock = 64;  // K elements per pipeline stage (one swap16 k-block)

struct GemmParams {
  const __nv_bfloat16* x;              // input rows, [*, k] row-major
  const uint4* qweight;                // [E, N/16, K/64, 32] x 16 B (swap16 words)
  const uint2* scales;                 // [E, N/16, K/64, 8] x 8 B
  __nv_bfloat16* out;                  // output rows, [*, n] row-major
  const int32_t* sorted_ids;           // indexed
  const int32_t* expert_ids;           // indexed
  const int32_t* num_tokens_post_padded;  // indexed, device scalar
  const void* expert_layout;           // contiguous: int64 offsets [E+1]; masked: int32 counts [E]
  int64_t n;
  int64_t k;
  int64_t num_experts;
  int64_t top_k;          // indexed: input row = sorted_id / top_k
  int64_t num_valid_ids;  // indexed: sentinel (M*top_k); ids >= it are padding
  int64_t num_blocks;     // indexed: blocks in the (possibly over-allocated) buffers
  int64_t max_rows;       // masked: rows per expert in the [E, max_rows, K] input
  int64_t rows;           // contiguous: rows of x (expert offsets are clamped to [0, rows])
  float* workspace;       // split-K: fp32 partial tiles [tiles, SPLIT, BT, BN]
  int32_t* counters;      // split-K: arrival count per tile (zero between launches)
};

enum class Family : int { kIndexed = 0, kContiguous = 1, kMasked = 2 };

}  // namespace chord

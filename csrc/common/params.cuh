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
  const uint4* qweight;                // [E, N/16/G, K/64, G, 32] x 16 B (swap16 words, Swap16Layout)
  const uint2* scales;                 // [E, N/16/G, K/64, G, 8] x 8 B
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

// Where a 16-row tile's K block lies in the weight layout `swap16g` (docs/architecture.md): an
// expert's N/16 tiles are stored in groups of G consecutive tiles (G = the largest power of two
// <= 8 that divides N/16), and within a group K block kb of all G tiles is one contiguous run
// (G * 512 bytes of words, G * 64 bytes of scales), so a CTA's stage is read in runs of up to
// 4 KB instead of 512-byte pieces 56 KB apart. block() counts 512-byte word blocks (= 64-byte
// scale blocks) from the start of qweight (scales); chord.formats packs the same order.
#ifndef CHORD_TILE_GROUP_LOG
#define CHORD_TILE_GROUP_LOG 3  // G <= 8; chord.jit lowers it only for the layout's ablation (CHORD_TILE_GROUP)
#endif
constexpr int kTileGroupMaxLog = CHORD_TILE_GROUP_LOG;
constexpr int kTileGroupMax = 1 << kTileGroupMaxLog;

// CTA_TILES: the CTA's 16-row tiles per N block (BN / 16). N is a multiple of BN, so when
// CTA_TILES is a multiple of 8 so is N/16 and G = 8 is known at compile time (every BN that is
// a multiple of 128): the K-block strides are constants. Otherwise (BN 16-64, 192) G is read
// from N at run time.
template <int CTA_TILES>
struct Swap16Layout {
  static constexpr bool kFixed = (CTA_TILES & -CTA_TILES) >= kTileGroupMax;
  int64_t tile_base;  // expert * N/16: the expert's first tile
  int kb_all;         // K / 64
  int lg_;            // log2(G) (unused when kFixed)

  __device__ __forceinline__ Swap16Layout(const GemmParams& p, int expert) {
    const int nt = static_cast<int>(p.n) / 16;
    const int low = nt & -nt;  // the largest power of two dividing N/16
    tile_base = static_cast<int64_t>(expert) * nt;
    kb_all = static_cast<int>(p.k) / kKBlock;
    lg_ = kFixed ? kTileGroupMaxLog : __ffs(low < kTileGroupMax ? low : kTileGroupMax) - 1;
  }
  __device__ __forceinline__ int lg() const { return kFixed ? kTileGroupMaxLog : lg_; }
  // Block of tile t (within the expert) and K block kb.
  __device__ __forceinline__ int64_t block(int t, int kb) const {
    const int l = lg();
    return (tile_base + ((t >> l) << l)) * kb_all + (kb << l) + (t & ((1 << l) - 1));
  }
  __device__ __forceinline__ int group() const { return 1 << lg(); }  // blocks between K blocks of a tile
  // kFixed only: from block (t, kb + kbs) to block (t + CTA_TILES, kb), the same tile of the next N
  // block (G divides CTA_TILES, so both lie at the same place of their groups).
  __device__ __forceinline__ int64_t next_n_block(int kbs) const {
    static_assert(kFixed, "next_n_block needs G to divide the CTA's tiles");
    return static_cast<int64_t>(CTA_TILES) * kb_all - (kbs << kTileGroupMaxLog);
  }
};

// K blocks [begin, end) of split z of a GEMM's K split over `split` CTAs (split-K: blockIdx.z),
// the one formula MoeKernel and the prefetches before the PDL wait (moe/prefetch.cuh) share.
struct KRange {
  int begin, end;
};
__device__ __forceinline__ KRange split_k_range(const GemmParams& p, int z, int split) {
  const int kb_all = static_cast<int>(p.k) / kKBlock;
  return {static_cast<int>((static_cast<int64_t>(kb_all) * z) / split),
          static_cast<int>((static_cast<int64_t>(kb_all) * (z + 1)) / split)};
}

enum class Family : int { kIndexed = 0, kContiguous = 1, kMasked = 2 };

// The main loop a schedule names (chord.schedule knob `mainloop`, Cfg::kMainloop); which part of
// mainloop/ runs it also depends on Cfg::kProducer (sm90_w4a16_moe.cuh, MainloopFor).
enum class Mainloop : int { kMma = 0, kWgmma = 1 };

// The "no tile walker" of a main loop's run(): one CTA per tile (the launched grid). A persistent
// CTA passes moe/rows.cuh's TileWalker instead.
struct NoWalker {};

}  // namespace chord

// Main loop `wgmma`: the operand swap at warpgroup scale (sm_90a).
//
// Each warp owns one 16-row weight tile (BN/16 warps, BN/64 warpgroups); a warpgroup's four
// tiles are the 64-row A operand of `wgmma.mma_async.m64n{BT}k16`, dequantized int4 -> bf16 in
// registers straight from the swap16 words (a warp's 16 rows of a wgmma A fragment have the
// per-lane arrangement of the mma.m16n8k16 A fragment, which is what a swap16 word holds). The
// BT token rows are the N side, read by the tensor cores from shared memory through a matrix
// descriptor: each 64-wide K block of a token row is one 128-byte row with the 128-byte swizzle,
// exactly the XOR swizzle the cp.async gather writes.
//
// Weights are loaded without an L2 eviction hint: at prefill a weight tile is read by every token
// tile of its raster group, so it should stay in L2. (With the hint, ptxas 13.0 put the 64-bit
// policy of the BN=64 kernels in an odd uniform register, which faulted as an illegal
// instruction on the H200.)
//
// Pipeline: a STAGES-deep cp.async ring of [activations | swap16 words | scales] per 64-wide K
// block. Per K block a warp reads its words and scales, dequantizes the four k16 steps into one
// of two register sets, issues four wgmmas as one group and waits until at most WAIT groups are
// in flight. WAIT = 1 (batched `wait_group 1`): the tensor cores run block kb while the warps
// dequantize kb+1; a ring slot is refilled two blocks after it was read, once the group that
// read it has retired in every warp (a CTA barrier lies between). WAIT = 0 retires each group before the next
// dequantization; both issue the same MMAs in the same order, so their outputs are bit-identical.
#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>

#include "../common/dequant.cuh"
#include "../common/params.cuh"
#include "../common/ptx.cuh"
#include "../common/wgmma.cuh"

namespace chord {

template <int BT, int BN, int STAGES, int WAIT>
struct WgmmaSwap64 {
  static_assert(BT % 8 == 0 && BT >= 8 && BT <= 256, "wgmma main loop: BT multiple of 8 in [8, 256]");
  static_assert(BN % 64 == 0 && BN >= 64 && BN <= 256, "wgmma main loop: BN in {64, 128, 192, 256}");
  static_assert(STAGES >= 3, "wgmma main loop: STAGES >= 3 (one slot is read by the group in flight)");
  static_assert(WAIT == 0 || WAIT == 1, "wgmma main loop: WAIT is 0 or 1");
  static constexpr int kWarps = BN / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kNTiles = BN / 16;
  static constexpr int kNTW = 1;
  static constexpr int kTT = BT / 8;
  static constexpr int kXBytes = BT * kKBlock * 2;   // 1024-aligned: BT % 8 == 0
  static constexpr int kWBytes = kNTiles * 32 * 16;  // swap16 words per stage
  static constexpr int kSBytes = kNTiles * 8 * 8;    // scales per stage
  static constexpr int kStageBytes = (kXBytes + kWBytes + kSBytes + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = STAGES * kStageBytes;
  static constexpr int kAlign = 1024;  // the 128-byte swizzle repeats every 1024 bytes

  using Acc = float[1][kTT][4];

  __device__ __forceinline__ static void run(const GemmParams& p, int expert, int n_block,
                                             const int64_t* __restrict__ in_row, int kb_begin, int kb_end,
                                             uint8_t* smem, Acc& acc) {
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int K = static_cast<int>(p.k);
    const int KB_ALL = K / kKBlock;
    const int KB = kb_end - kb_begin;
    const int NT = static_cast<int>(p.n) / 16;
    const uint32_t smem_base = smem_u32(smem);

    // Weights: one 16-byte chunk per thread per stage (kThreads == kNTiles * 32); scales: the
    // first kNTiles * 4 threads. Activations: BT * 8 chunks, rows looked up in in_row.
    constexpr int T = kThreads;
    constexpr int kSChunks = kNTiles * 4;
    constexpr int kXChunks = BT * 8;
    constexpr int kXIters = (kXChunks + T - 1) / T;
    const int64_t tile0 = static_cast<int64_t>(expert) * NT + n_block * kNTiles;
    const uint4* wsrc = p.qweight + ((tile0 + tid / 32) * KB_ALL + kb_begin) * 32 + (tid % 32);
    const uint8_t* ssrc = reinterpret_cast<const uint8_t*>(p.scales + ((tile0 + tid / 4) * KB_ALL + kb_begin) * 8) +
                          (tid % 4) * 16;
    const __nv_bfloat16* xbase = p.x + static_cast<int64_t>(kb_begin) * kKBlock;

    auto load_stage = [&](int s, int kb) {
      const uint32_t st = smem_base + s * kStageBytes;
#pragma unroll
      for (int it = 0; it < kXIters; ++it) {
        const int c = tid + it * T;
        if (kXChunks % T == 0 || c < kXChunks) {
          const int r = c / 8, ch = c % 8;
          const int64_t row = in_row[r];
          const __nv_bfloat16* src = xbase + (row >= 0 ? row * K + kb * kKBlock + ch * 8 : 0);
          cp_async_16_u32(st + r * 128 + ((ch ^ (r & 7)) * 16), src, row >= 0);
        }
      }
      cp_async_16_u32(st + kXBytes + tid * 16, wsrc + kb * 32, true);
      if (tid < kSChunks) cp_async_16_u32(st + kXBytes + kWBytes + tid * 16, ssrc + kb * 64, true);
    };

#pragma unroll
    for (int i = 0; i < kTT; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[0][i][c] = 0.f;

    const uint64_t desc0 = smem_desc_k128(smem_base);

    // One K block into register set `a` (the other set may still be read by the group in flight).
    auto block = [&](int kb, uint32_t (&a)[4][4], auto drain) {
      cp_async_wait<STAGES - 3>();
      fence_proxy_async_shared();  // cp.async writes -> visible to the tensor cores' async proxy
      __syncthreads();             // block kb landed for all; groups <= kb-2 retired in all warps
      {
        const int next = kb + STAGES - 2;
        if (next < KB) load_stage(next % STAGES, next);
        cp_async_commit();
      }
      const int slot = kb % STAGES;
      const uint8_t* st = smem + slot * kStageBytes;
      const uint4 words = reinterpret_cast<const uint4*>(st + kXBytes)[warp * 32 + lane];
      const uint2 scl = reinterpret_cast<const uint2*>(st + kXBytes + kWBytes)[warp * 8 + lane / 4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __nv_bfloat162 sp = as_bf162(h == 0 ? scl.x : scl.y);
        const __nv_bfloat162 s_lo = __low2bfloat162(sp);
        const __nv_bfloat162 s_hi = __high2bfloat162(sp);
        dequant_swap16(h == 0 ? words.x : words.z, s_lo, s_hi, a[2 * h]);
        dequant_swap16(h == 0 ? words.y : words.w, s_lo, s_hi, a[2 * h + 1]);
      }
      wgmma_fence();
      const uint64_t desc = desc0 + static_cast<uint64_t>((slot * kStageBytes) >> 4);
#pragma unroll
      for (int s = 0; s < 4; ++s) WgmmaRA<BT>::mma(acc[0], a[s], desc + static_cast<uint64_t>(s * 2), 1);
      wgmma_commit();
      if (decltype(drain)::value || kb + 1 == KB) {
        wgmma_wait<0>();  // the last block: retire everything before the epilogue reads acc
      } else {
        wgmma_wait<WAIT>();  // no accumulator access here: a group may still be in flight
      }
    };

    // Prologue: STAGES-2 K blocks in flight (one more slot is read by the group in flight).
#pragma unroll
    for (int s = 0; s < STAGES - 2; ++s) {
      if (s < KB) load_stage(s, s);
      cp_async_commit();
    }
    wgmma_fence_operand(acc[0]);
    uint32_t a0[4][4], a1[4][4];
    int kb = 0;
    if (KB & 1) block(kb++, a1, std::true_type{});  // odd count: the lone block first, retired before the loop
    for (; kb < KB; kb += 2) {
      block(kb, a0, std::false_type{});
      block(kb + 1, a1, std::false_type{});
    }
    wgmma_wait<0>();
    wgmma_fence_operand(acc[0]);
    cp_async_wait<0>();
    __syncthreads();  // every read of the pipeline's shared memory is done (the epilogue reuses it)
  }
};

}  // namespace chord

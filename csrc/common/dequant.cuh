// INT4 (stored as q+8, 0..15) -> bf16 A fragments of mma.m16n8k16, with group scales.
//
// A `swap16` word holds the eight codes one lane needs for one 16x16 weight tile, arranged so
// that (word >> 4j) & 0x000F000F is the j-th A register: low half = nibble j, high half =
// nibble j+4. OR-ing the bf16 exponent pattern 0x4300 (=128.0, whose ulp is 1) turns a code u
// into the bf16 value 128+u exactly; subtracting 136 (exact) gives q = u-8 in [-8, 7], and one
// multiply by the bf16 scale rounds once, the same rounding as bf16(q * scale).
#pragma once

#include "ptx.cuh"

namespace chord {

// regs[0..3] = A registers of one 16x16 tile: {row g, k lo}, {row g+8, k lo}, {row g, k hi},
// {row g+8, k hi}. s_lo/s_hi = scale of row g / row g+8 (broadcast to both halves).
__device__ __forceinline__ void dequant_swap16(uint32_t word, __nv_bfloat162 s_lo, __nv_bfloat162 s_hi,
                                               uint32_t (&regs)[4]) {
  const __nv_bfloat162 bias = as_bf162(0x43084308u);  // 136.0 in both halves
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t raw = lop3_and_or(word >> (4 * j), 0x000F000Fu, 0x43004300u);
    const __nv_bfloat162 q = __hsub2(as_bf162(raw), bias);
    regs[j] = as_u32(__hmul2(q, (j & 1) ? s_hi : s_lo));
  }
}

// One 16-feature weight tile's two k16 steps of scale group h (steps 2h and 2h + 1, h a constant
// once unrolled): each step's word of the tile's swap16 words dequantized with the group's bf16
// scale pair (row g low, row g + 8 high), its four A registers handed to mma(ss2, a) with ss2 the
// step within the group. Both mma-loop parts (MmaSwap16, MmaDirect) dequantize through it.
template <class Mma>
__device__ __forceinline__ void dequant_group(const uint4& words, uint32_t scale_pair, int h, Mma&& mma) {
  const __nv_bfloat162 sp = as_bf162(scale_pair);
  const __nv_bfloat162 s_lo = __low2bfloat162(sp);
  const __nv_bfloat162 s_hi = __high2bfloat162(sp);
#pragma unroll
  for (int ss2 = 0; ss2 < 2; ++ss2) {
    const int step = 2 * h + ss2;
    const uint32_t w = step == 0 ? words.x : step == 1 ? words.y : step == 2 ? words.z : words.w;
    uint32_t a[4];
    dequant_swap16(w, s_lo, s_hi, a);
    mma(ss2, a);
  }
}

// The folded path (MmaSwap16 with Cfg::kFold): the same A registers holding the bf16 values
// 128 + u (exact) with neither the bias nor the scale applied. The MMA of a 32-K scale group then
// starts from -136 * sum(x) (an MMA of the constant -136 with the group's activations) so its
// fp32 partial sum is sum((u - 8) * x) = sum(q * x), and the scale multiplies that partial sum once.
__device__ __forceinline__ void codes_swap16(uint32_t word, uint32_t (&regs)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) regs[j] = lop3_and_or(word >> (4 * j), 0x000F000Fu, 0x43004300u);
}

// The folded path's two halves for one 32-K scale group h, shared by MmaSwap16 and MmaDirect
// (with Cfg::kFold). fold_bias: a token tile's bias = -136 * sum_k x over the group, one MMA pair
// of the constant -136 with its B fragments b = {step 2h: k lo, k hi; step 2h + 1: k lo, k hi}
// (once per token tile for all of a warp's weight tiles). fold_group: one weight tile's partial
// of the group, started from the bias, with its raw codes 128 + u as the A operand (exact bf16),
// so it ends as sum(q * x) in fp32, then acc += scale * partial (rows g / g + 8, elements 0-1 /
// 2-3, take the low / high scale).
__device__ __forceinline__ void fold_bias(const uint32_t (&b)[4], float (&bias)[4]) {
  const uint32_t neg_bias[4] = {0xC308C308u, 0xC308C308u, 0xC308C308u, 0xC308C308u};  // -136.0
  const float zero[4] = {0.f, 0.f, 0.f, 0.f};
  mma_bf16_m16n8k16_c(bias, neg_bias, b[0], b[1], zero);
  mma_bf16_m16n8k16(bias, neg_bias, b[2], b[3]);
}
template <int KT>
__device__ __forceinline__ void fold_group(const uint4& words, uint32_t scale_pair, int h, const uint32_t (&b)[KT][4],
                                           const float (&bias)[KT][4], float (&acc)[KT][4]) {
  const __nv_bfloat162 sp = as_bf162(scale_pair);
  const float s_lo = __low2float(sp);
  const float s_hi = __high2float(sp);
  const uint32_t w0 = h == 0 ? words.x : words.z;
  const uint32_t w1 = h == 0 ? words.y : words.w;
  uint32_t a0[4], a1[4];
  codes_swap16(w0, a0);
  codes_swap16(w1, a1);
#pragma unroll
  for (int i = 0; i < KT; ++i) {
    float part[4];
    mma_bf16_m16n8k16_c(part, a0, b[i][0], b[i][1], bias[i]);
    mma_bf16_m16n8k16(part, a1, b[i][2], b[i][3]);
    acc[i][0] = fmaf(s_lo, part[0], acc[i][0]);
    acc[i][1] = fmaf(s_lo, part[1], acc[i][1]);
    acc[i][2] = fmaf(s_hi, part[2], acc[i][2]);
    acc[i][3] = fmaf(s_hi, part[3], acc[i][3]);
  }
}

}  // namespace chord

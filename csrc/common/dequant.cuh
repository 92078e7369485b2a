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

}  // namespace chord

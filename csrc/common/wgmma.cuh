// Warpgroup MMA (sm_90a): fences, commit/wait groups, shared-memory matrix descriptors.
//
// A warpgroup is 4 consecutive warps starting at a warp index divisible by 4. wgmma runs
// asynchronously: registers written by ordinary instructions (the dequantized A operand) are
// ordered before the next wgmma by wgmma_fence(); a committed group reads its A registers and
// shared-memory B tile until wgmma_wait<N>() reports at most N groups still in flight.
#pragma once

#include <cstdint>

#include "wgmma_ops.cuh"

namespace chord {

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads/writes across wgmma fences and waits.
template <int R, int C>
__device__ __forceinline__ void wgmma_fence_operand(float (&d)[R][C]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < C; ++j) asm volatile("" : "+f"(d[i][j])::"memory");
}

// Descriptor of a K-major bf16 operand stored as 128-byte rows (64 K elements) with the 128-byte
// swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)), 8-row groups 1024 bytes apart. The
// tile must start on a 1024-byte boundary; advancing along K inside the row is start + 32 B per
// k16 step. Fields (PTX ISA, matrix descriptor): start >> 4 in bits 0-13, leading byte offset
// (unused for swizzled K-major, 1) in 16-29, stride byte offset >> 4 in 32-45, swizzle mode in
// 62-63 (1 = 128 B).
__device__ __forceinline__ uint64_t smem_desc_k128(uint32_t smem_addr) {
  uint64_t desc = static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>(1) << 16;
  desc |= static_cast<uint64_t>(1024 >> 4) << 32;
  desc |= static_cast<uint64_t>(1) << 62;
  return desc;
}

// Register reallocation between warpgroups (sm_90a): takes effect when the kernel has a register
// cap at entry (__launch_bounds__(threads, 1)); every warp of the warpgroup executes it.
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace chord

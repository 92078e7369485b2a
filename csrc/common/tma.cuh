// Bulk async copies (sm_90): the copy engine moves whole pieces of a pipeline stage into shared
// memory and counts their bytes on the stage's mbarrier (complete_tx), so one thread issues a
// stage instead of every thread issuing 16-byte cp.async copies (the announcement of the bytes:
// mbarrier.cuh, mbar_arrive_expect_tx).
//
// * `bulk_copy_g2s`: cp.async.bulk, a contiguous run of bytes (16-byte aligned, a multiple of 16).
// * `tma_load_2d`: cp.async.bulk.tensor, a box of a 2-D tensor described by a tensor map that the
//   host encoded (chord.jit.encode_tensor_map_2d, cuTensorMapEncodeTiled), written to shared
//   memory with the map's swizzle; rows past the tensor's end arrive as zeros.
#pragma once

#include <cstdint>

#include "ptx.cuh"

namespace chord {

// A CUtensorMap (cuda.h) by value: 128 opaque bytes, passed as a __grid_constant__ kernel
// parameter and read by the copy engine through its generic address.
struct alignas(128) TmaDescriptor {
  uint64_t opaque[16];
};
static_assert(sizeof(TmaDescriptor) == 128, "a CUtensorMap is 128 bytes");

// `bytes` bytes from global `src` to shared `dst`, completing on mbarrier `bar`.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// The same copy with an L2 eviction hint (`policy`: ptx.cuh make_evict_first_policy), for bytes
// read once (the decode weights); without the hint under CHORD_NO_L2_HINT.
__device__ __forceinline__ void bulk_copy_g2s_stream(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                                     uint64_t policy) {
#ifdef CHORD_NO_L2_HINT
  (void)policy;
  bulk_copy_g2s(dst, src, bytes, bar);
#else
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
#endif
}

// The box of `map` at (c0 = innermost coordinate, c1 = row) to shared `dst`, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const TmaDescriptor* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// Asks the copy engine to bring `bytes` bytes at global `src` into L2 (16-byte aligned, a multiple of
// 16): no destination, no completion to wait for, and no fault or effect on any value (a hint).
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

// Brings the tensor map into the copy engine's descriptor cache ahead of its first use.
__device__ __forceinline__ void tma_prefetch_descriptor(const TmaDescriptor* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace chord

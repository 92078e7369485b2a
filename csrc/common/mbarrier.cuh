// mbarrier wrappers (sm_90): shared-memory barriers with a phase bit, used to hand pipeline
// stages between a producer warp and the consumer warpgroups without CTA-wide barriers.
#pragma once

#include <cstdint>

namespace chord {

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(count) : "memory");
}

// Makes initialized barriers visible to the other threads (and the async proxy) of the CTA;
// a CTA barrier must follow before any thread uses them.
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrive (release semantics at CTA scope): this thread's earlier writes are visible to threads
// that observe the phase completion.
// A producer/consumer ring's barriers (the producer loops: mma_producer.cuh,
// wgmma_warp_specialized.cuh): thread 0 sets each slot's `full` barrier to `full_count` arrivals and
// its `empty` barrier to `empty_count`, then makes the inits visible; the CTA barrier after it
// orders every thread's first wait behind them.
template <int STAGES>
__device__ __forceinline__ void mbar_init_ring(uint64_t (&full)[STAGES], uint64_t (&empty)[STAGES], int full_count,
                                               int empty_count) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], full_count);
      mbar_init(&empty[s], empty_count);
    }
    mbar_fence_init();
  }
  __syncthreads();
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(a) : "memory");
}

// Arrive (count 1) and announce `bytes` that bulk copies (common/tma.cuh) will complete on `bar`
// in this phase: the phase completes when every arrival is in and those bytes have landed.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(a), "r"(bytes) : "memory");
}

// Arrive on `bar` once this thread's cp.async copies issued so far have landed (.noinc: the arrival
// is one of the count the barrier was initialized with).
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint64_t* bar) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(a) : "memory");
}

// Waits (acquire semantics) until the phase with parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "LAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra LAB_WAIT;\n"
      "}\n" ::"r"(a),
      "r"(parity)
      : "memory");
}

}  // namespace chord

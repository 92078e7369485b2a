// Thin PTX wrappers used by Chord's kernels (sm_90a). Header-only, no torch.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

namespace chord {

// ---- cp.async (Ampere-style asynchronous global->shared copies) ------------------------------

// 16-byte copy; when `valid` is false the destination is zero-filled and nothing is read.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes)
               : "memory");
}

// Same, with the shared-memory destination as a 32-bit shared address.
__device__ __forceinline__ void cp_async_16_u32(uint32_t dst, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes)
               : "memory");
}

// 16-byte copy, or (skip != 0) a zero-fill of the destination that reads nothing: the
// ignore-src form, whose predicate the caller computed once (not a byte count per copy).
__device__ __forceinline__ void cp_async_16_zfill(uint32_t dst, const void* gmem, uint32_t skip) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n cp.async.cg.shared.global [%0], [%1], 16, p;\n}\n" ::"r"(dst),
      "l"(gmem), "r"(skip)
      : "memory");
}

// 16-byte copy issued only where `pred` holds (no branch around it).
__device__ __forceinline__ void cp_async_16_if(uint32_t dst, const void* gmem, bool pred) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p cp.async.cg.shared.global [%0], [%1], 16;\n}\n" ::"r"(dst),
      "l"(gmem), "r"(static_cast<uint32_t>(pred))
      : "memory");
}

// 16-byte copy with an L2 eviction hint: weights are streamed once, so evict them first.
// CHORD_NO_L2_HINT (chord.jit sets it when ptxas miscompiled the hint's 64-bit policy operand
// into an odd uniform register, which traps): the same copy without the hint.
__device__ __forceinline__ void cp_async_16_stream_u32(uint32_t dst, const void* gmem, uint64_t policy) {
#ifdef CHORD_NO_L2_HINT
  (void)policy;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
#else
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "l"(policy)
               : "memory");
#endif
}

// The activation copies of the wgmma multistage loop with an L2 policy (knob l2_hint): the
// gather's zero-fill form and the scale copy's predicated form of the two copies above, each
// carrying a 64-bit cache policy (make_evict_last_policy, make_evict_first_policy); without it
// under CHORD_NO_L2_HINT.
__device__ __forceinline__ void cp_async_16_zfill_hint(uint32_t dst, const void* gmem, uint32_t skip,
                                                       uint64_t policy) {
#ifdef CHORD_NO_L2_HINT
  (void)policy;
  cp_async_16_zfill(dst, gmem, skip);
#else
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n"
      " cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, p, %3;\n}\n" ::"r"(dst),
      "l"(gmem), "r"(skip), "l"(policy)
      : "memory");
#endif
}

__device__ __forceinline__ void cp_async_16_if_hint(uint32_t dst, const void* gmem, bool pred, uint64_t policy) {
#ifdef CHORD_NO_L2_HINT
  (void)policy;
  cp_async_16_if(dst, gmem, pred);
#else
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n"
      " @p cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %3;\n}\n" ::"r"(dst),
      "l"(gmem), "r"(static_cast<uint32_t>(pred)), "l"(policy)
      : "memory");
#endif
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// An L2 cache policy for the hinted copies: every line they read gets the eviction priority
// evict_first (EVICT_LAST false: bytes read once, such as streamed weights) or evict_last (bytes
// read again later in the kernel, such as the indexed family's gathered token rows, read once
// per expert the token is routed to and per N block).
template <bool EVICT_LAST>
__device__ __forceinline__ uint64_t make_l2_policy() {
#ifdef CHORD_NO_L2_HINT
  return 0;  // unused: the copies carry no hint
#else
  uint64_t policy;
  if constexpr (EVICT_LAST) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  }
  return policy;
#endif
}

__device__ __forceinline__ uint64_t make_evict_first_policy() { return make_l2_policy<false>(); }
__device__ __forceinline__ uint64_t make_evict_last_policy() { return make_l2_policy<true>(); }

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Orders this thread's generic-proxy shared-memory writes (cp.async, st.shared) before later
// async-proxy reads (wgmma operands, bulk copies) once a barrier has been crossed.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- ldmatrix / mma ---------------------------------------------------------------------------

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row_ptr) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Four (x4) or two (x2) 8x8 bf16 matrices from registers to shared memory, transposed: lane l's
// register i holds row l/4, columns 2(l%4) and 2(l%4)+1 of matrix i (the mma C fragment, packed
// low = even column); memory row r of matrix i is 16 bytes at the address lane 8i + r supplies,
// holding column r of the fragment.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ void stmatrix_x2_trans(uint32_t addr, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};\n" ::"r"(addr), "r"(r0), "r"(r1)
               : "memory");
}

// D = A(16x16, row) * B(16x8, col) + D, bf16 operands, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                  uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d = a * b + c with a separate accumulator input (the folded mma loop starts a scale group's
// partial sums from the code bias term instead of from zero).
__device__ __forceinline__ void mma_bf16_m16n8k16_c(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                                    const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// ---- programmatic dependent launch (grid dependency control, PTX 7.8, sm_90) -------------------
// Both are no-ops in a grid launched without the programmatic-serialization attribute.

// Waits until every grid this one depends on has completed and its memory operations are
// visible to this grid: nothing a previous kernel on the stream wrote may be read before it.
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// Lets the next grid on the stream launch (its CTAs then wait in griddep_wait for this grid to
// finish) once every CTA of this grid has issued it or exited.
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Loads that may run before griddep_wait, while the previous grid may still be writing the word:
// relaxed at GPU scope, so they are served by L2 and never leave a line in L1 that a load after the
// wait could hit (an L1 line is not refreshed by the wait). The value is a guess; only what is read
// after the wait may decide a result.
__device__ __forceinline__ int32_t ld_relaxed_gpu(const int32_t* a) {
  int32_t v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(a) : "memory");
  return v;
}
__device__ __forceinline__ int64_t ld_relaxed_gpu(const int64_t* a) {
  int64_t v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];\n" : "=l"(v) : "l"(a) : "memory");
  return v;
}

// The SM count of the device (%nsmid).
__device__ __forceinline__ uint32_t num_sms() {
  uint32_t n;
  asm("mov.u32 %0, %%nsmid;\n" : "=r"(n));
  return n;
}

// ---- misc ------------------------------------------------------------------------------------

// Zeroes a register accumulator of any [A][B][C] shape (both main loops' fragments), unrolled.
template <int A, int B, int C>
__device__ __forceinline__ void zero_acc(float (&acc)[A][B][C]) {
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < B; ++j)
#pragma unroll
      for (int c = 0; c < C; ++c) acc[i][j][c] = 0.f;
}

__device__ __forceinline__ uint32_t lop3_and_or(uint32_t x, uint32_t mask, uint32_t bits) {
  // (x & mask) | bits in one LOP3.
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(x), "r"(mask), "r"(bits));
  return r;
}

__device__ __forceinline__ uint32_t as_u32(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }
__device__ __forceinline__ __nv_bfloat162 as_bf162(uint32_t v) {
  return *reinterpret_cast<__nv_bfloat162*>(&v);
}

// Thread-block clusters (split_cluster): every thread of every CTA of the cluster arrives, with
// release semantics for its shared-memory writes (SASS: MEMBAR.ALL.GPU, so it also waits for the
// thread's outstanding global stores), and waits with acquire semantics for theirs.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The same meeting without the release fence: for a barrier that only has to order reads whose
// values the thread has already used (nothing it wrote needs to be seen by the others).
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// The shared::cluster address of shared address `addr` of this CTA in the cluster's CTA `rank`.
__device__ __forceinline__ uint32_t mapa_shared(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}

__device__ __forceinline__ float4 ld_shared_cluster_f4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// Barrier over the first THREADS threads: the whole CTA (ALL) or a named barrier of the warps
// that run the epilogue (a producer warpgroup has left by then).
template <int THREADS, bool ALL>
__device__ __forceinline__ void epilogue_sync() {
  if constexpr (ALL) {
    __syncthreads();
  } else {
    asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
  }
}

}  // namespace chord

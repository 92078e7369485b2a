// A streaming-read probe: a kernel that only moves bytes from HBM into the SM, with the copy
// paths the GEMMs use, and no math. It answers what rate a memory-bound GEMM could reach on
// this GPU with a given copy path, ring depth and occupancy (chord.bench.read_probe), so a
// decode row's gap to the HBM floor can be split into "the copy path's limit" and "the
// kernel's own cost".
//
// One CTA streams one contiguous region of `region_bytes` bytes (like one 128-feature weight
// group of the swap16g layout, K/64 x 4 KB), STAGE_BYTES per step:
//   MODE 0  cp.async 16-byte copies by every thread into a ring of STAGES slots, evict-first L2
//           hint, cp.async.wait_group + a CTA barrier per step (the mma loop's copy path);
//   MODE 1  one cp.async.bulk per step by thread 0, completing on the slot's mbarrier (the
//           wgmma loop's bulk_w path);
//   MODE 2  16-byte ld.global.cs loads into registers, STAGES loads in flight per thread (no
//           shared memory).
// Each thread XORs one 32-bit word per step (MODE 2: every word it loaded) into sink[cta *
// THREADS + tid], so the loads stay live and the host can check that the right bytes arrived.
#pragma once

#include <cstdint>

#include "common/mbarrier.cuh"
#include "common/ptx.cuh"
#include "common/tma.cuh"

namespace chord {

struct ReadProbeParams {
  const uint8_t* src;
  uint32_t* sink;
  int64_t region_bytes;  // bytes per CTA, a multiple of STAGE_BYTES
  int64_t regions;       // CTAs (the grid's x)
};

template <int MODE, int THREADS, int STAGE_BYTES, int STAGES>
struct ReadProbe {
  static_assert(MODE >= 0 && MODE <= 2, "MODE: 0 cp.async, 1 cp.async.bulk, 2 ld.global");
  static_assert(STAGES >= 2, "at least two ring slots / loads in flight");
  static_assert(STAGE_BYTES % (16 * THREADS) == 0, "a step is whole 16-byte pieces for every thread");
  static constexpr int kPieces = STAGE_BYTES / 16 / THREADS;  // 16-byte pieces per thread and step
  static constexpr int kSmemBytes = MODE == 2 ? 0 : STAGES * STAGE_BYTES;

  __device__ __forceinline__ static void run(const ReadProbeParams& p) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = static_cast<int>(threadIdx.x);
    const uint8_t* base = p.src + static_cast<int64_t>(blockIdx.x) * p.region_bytes;
    const int steps = static_cast<int>(p.region_bytes / STAGE_BYTES);
    uint32_t acc = 0;
    if constexpr (MODE == 2) {
      // region_bytes is a multiple of THREADS x 16 x STAGES (chord.bench.read_probe), so every
      // round issues all STAGES loads before the first result is used (volatile: kept in order,
      // none folded into the XORs that follow)
      const uint8_t* v = base + tid * 16;
      const int rounds = static_cast<int>(p.region_bytes / (THREADS * 16 * STAGES));
      for (int i = 0; i < rounds; ++i) {
        uint32_t r[STAGES][4];
#pragma unroll
        for (int j = 0; j < STAGES; ++j) {
          const uint8_t* g = v + (static_cast<int64_t>(i) * STAGES + j) * THREADS * 16;
          asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                       : "=r"(r[j][0]), "=r"(r[j][1]), "=r"(r[j][2]), "=r"(r[j][3])
                       : "l"(g));
        }
#pragma unroll
        for (int j = 0; j < STAGES; ++j) acc ^= r[j][0] ^ r[j][1] ^ r[j][2] ^ r[j][3];
      }
    } else if constexpr (MODE == 0) {
      const uint32_t ring = smem_u32(smem);
      const uint64_t policy = make_evict_first_policy();
      auto issue = [&](int st) {
        if (st < steps) {
          const uint8_t* g = base + static_cast<int64_t>(st) * STAGE_BYTES;
          const uint32_t s = ring + (st % STAGES) * STAGE_BYTES;
#pragma unroll
          for (int c = 0; c < kPieces; ++c) cp_async_16_stream_u32(s + (c * THREADS + tid) * 16, g + (c * THREADS + tid) * 16, policy);
        }
        cp_async_commit();  // an empty group past the end keeps the wait count uniform
      };
#pragma unroll
      for (int st = 0; st < STAGES - 1; ++st) issue(st);
      for (int st = 0; st < steps; ++st) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // step st landed for every thread; step st-1's slot is no longer read
        acc ^= *reinterpret_cast<const uint32_t*>(smem + (st % STAGES) * STAGE_BYTES + tid * 16);
        issue(st + STAGES - 1);
      }
    } else {
      __shared__ __align__(8) uint64_t bar[STAGES];
      const uint32_t ring = smem_u32(smem);
      if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) mbar_init(&bar[s], 1);
        mbar_fence_init();
      }
      __syncthreads();
      auto issue = [&](int st) {
        if (tid == 0 && st < steps) {
          const int slot = st % STAGES;
          fence_proxy_async_shared();  // the slot's earlier generic reads before the copy engine's writes
          mbar_arrive_expect_tx(&bar[slot], STAGE_BYTES);
          bulk_copy_g2s(ring + slot * STAGE_BYTES, base + static_cast<int64_t>(st) * STAGE_BYTES, STAGE_BYTES,
                        smem_u32(&bar[slot]));
        }
      };
#pragma unroll
      for (int st = 0; st < STAGES - 1; ++st) issue(st);
      for (int st = 0; st < steps; ++st) {
        mbar_wait(&bar[st % STAGES], static_cast<uint32_t>((st / STAGES) & 1));
        acc ^= *reinterpret_cast<const uint32_t*>(smem + (st % STAGES) * STAGE_BYTES + tid * 16);
        __syncthreads();  // every thread is done with slot st-1, which the next issue refills
        issue(st + STAGES - 1);
      }
    }
    p.sink[static_cast<int64_t>(blockIdx.x) * THREADS + tid] = acc;
  }
};

}  // namespace chord

// Per-CTA time stamps for the lab's kernel anatomy (chord.lab.stamps, `chord stamps`): only in a
// build with -DCHORD_STAMPS; otherwise every CHORD_STAMP_* macro is empty and the kernel's code
// is the same instruction for instruction.
//
// A stamped kernel has two module globals the host sets through cuModuleGetGlobal before the
// launch: `chord_stamp_buf`, kStampSlots 64-bit words per CTA (CTA = blockIdx.x + gridDim.x *
// (blockIdx.y + gridDim.y * blockIdx.z)), and `chord_stamp_ctas`, how many CTAs it has room for
// (a CTA past it records nothing). The host fills the buffer before each launch (chord.lab.stamps:
// the "earliest" slots with ~0, the others with 0), so a slot still holding its fill was never
// reached. %clock64 is the SM's cycle counter (fine, not comparable across SMs); %globaltimer is
// the GPU's nanosecond clock (comparable across SMs, coarser: chord.lab.stamps measures its step).
#pragma once

#include <cstdint>

namespace chord {

enum StampSlot : int {
  kStampEntry = 0,      // %globaltimer at the CTA's entry (thread 0)
  kStampEntryClk = 1,   // %clock64 at entry (thread 0)
  kStampWaitClk = 2,    // after griddepcontrol.wait (PDL kernels; else the entry again)
  kStampRowsClk = 3,    // the tile's rows are in shared memory (one-item-per-CTA kernels)
  kStampFirstClk = 4,   // the first K block of the ring has landed (earliest thread of the CTA)
  kStampEpiClk = 5,     // the first epilogue begins: the main loop is done (earliest thread)
  kStampFixupClk = 6,   // split-K: this CTA is the tile's last and starts the fix-up
  kStampExitClk = 7,    // the CTA's last thread leaves (latest thread)
  kStampExit = 8,       // %globaltimer when the CTA's last thread leaves (latest thread)
  kStampSm = 9,         // %smid
  kStampSlots = 16,
};

}  // namespace chord

#ifdef CHORD_STAMPS
extern "C" {
__device__ unsigned long long* chord_stamp_buf = nullptr;
__device__ unsigned int chord_stamp_ctas = 0;
}

namespace chord {

__device__ __forceinline__ uint64_t stamp_globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint64_t stamp_clock() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(t));
  return t;
}

// This CTA's record, or nullptr (no buffer set, or past its end).
__device__ __forceinline__ unsigned long long* stamp_record() {
  const unsigned int cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (chord_stamp_buf == nullptr || cta >= chord_stamp_ctas) return nullptr;
  return chord_stamp_buf + static_cast<uint64_t>(cta) * kStampSlots;
}

}  // namespace chord

// thread 0 writes a slot (entry, rows)
#define CHORD_STAMP_T0(slot, value)                                  \
  do {                                                               \
    if (threadIdx.x == 0) {                                          \
      unsigned long long* r_ = ::chord::stamp_record();              \
      if (r_) r_[slot] = (value);                                    \
    }                                                                \
  } while (0)
// the earliest of the calling threads' lane 0s (first stage, epilogue)
#define CHORD_STAMP_MIN(slot)                                          \
  do {                                                                 \
    if ((threadIdx.x & 31) == 0) {                                     \
      unsigned long long* r_ = ::chord::stamp_record();                \
      if (r_) atomicMin(r_ + (slot), ::chord::stamp_clock());          \
    }                                                                  \
  } while (0)
// the latest of the calling threads' lane 0s (exit), both clocks
#define CHORD_STAMP_EXIT()                                                          \
  do {                                                                              \
    if ((threadIdx.x & 31) == 0) {                                                  \
      unsigned long long* r_ = ::chord::stamp_record();                             \
      if (r_) {                                                                     \
        atomicMax(r_ + ::chord::kStampExitClk, ::chord::stamp_clock());             \
        atomicMax(r_ + ::chord::kStampExit, ::chord::stamp_globaltimer());          \
      }                                                                             \
    }                                                                               \
  } while (0)
#define CHORD_STAMP_ENTRY()                                                              \
  do {                                                                                   \
    if (threadIdx.x == 0) {                                                              \
      unsigned long long* r_ = ::chord::stamp_record();                                  \
      if (r_) {                                                                          \
        unsigned int sm_;                                                                \
        asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm_));                               \
        r_[::chord::kStampEntryClk] = ::chord::stamp_clock();                            \
        r_[::chord::kStampEntry] = ::chord::stamp_globaltimer();                         \
        r_[::chord::kStampSm] = sm_;                                                     \
      }                                                                                  \
    }                                                                                    \
  } while (0)
#define CHORD_STAMP_CLOCK_T0(slot) CHORD_STAMP_T0(slot, ::chord::stamp_clock())
#else
#define CHORD_STAMP_ENTRY() \
  do {                      \
  } while (0)
#define CHORD_STAMP_CLOCK_T0(slot) \
  do {                             \
  } while (0)
#define CHORD_STAMP_MIN(slot) \
  do {                        \
  } while (0)
#define CHORD_STAMP_EXIT() \
  do {                     \
  } while (0)
#endif

// The activation between gate_up and down (the `humming` root's process_input): one elementwise
// pass y = f(a, b) over bf16 rows, for any float expression vLLM names. humming/activation.py
// renders a translation unit per expression: a struct `Act` with the activation type and the
// expression verbatim (Act::f), and one extern "C" kernel that calls act_narrow<Act> or
// act_wide<Act> here (which one a launch takes: humming.activation.shape_for).
//
// Layouts (ActParams::layout): 0 normal (row r -> row r; rows >= *num_valid skipped), 1 grouped
// mask (rows [E, max_rows]; row r of expert e valid if r % max_rows < expert_tokens[e]), 2 scatter
// (input row r -> rows scatter_idx[r, :]; targets < 0 or >= out_rows ignored, targets >=
// *num_valid invalid). Invalid rows are left untouched, or zeroed with zero_invalid. The counts
// are read by the kernel (CUDA-graph capturable).
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

namespace chord {
namespace act {

// The parameter block; humming/activation.py packs it (struct "<5Q8q6i").
struct ActParams {
  const __nv_bfloat16* in;
  __nv_bfloat16* out;
  const int32_t* scatter_idx;
  const int32_t* expert_tokens;
  const void* num_valid;
  long long rows, cols, in_stride, out_stride, out_rows, scatter_cols, max_rows, rows_per_cta;
  int layout, zero_invalid, num_valid_is_64, vec, pair, pad;
};
static_assert(sizeof(ActParams) == 5 * 8 + 8 * 8 + 6 * 4, "ActParams: the layout humming/activation.py packs");

// How a row holds the inputs of output j (Act::kType).
enum Type : int { kUnary = 0, kBinarySplit = 1, kBinaryInterleaved = 2 };

// The inputs (a, b) of output j of a row of `cols` outputs (b = 0 for a unary activation).
template <class Act>
__device__ __forceinline__ void load(const __nv_bfloat16* row, long long cols, long long j, float& a, float& b) {
  if constexpr (Act::kType == kUnary) {
    a = __bfloat162float(row[j]);
    b = 0.f;
  } else if constexpr (Act::kType == kBinarySplit) {
    a = __bfloat162float(row[j]);
    b = __bfloat162float(row[cols + j]);
  } else {
    a = __bfloat162float(row[2 * j]);
    b = __bfloat162float(row[2 * j + 1]);
  }
}

// y for 8 consecutive outputs j..j+7 (16-byte loads; cols a multiple of 8, 16-byte aligned rows)
template <class Act>
__device__ __forceinline__ uint4 compute8(const __nv_bfloat16* row, long long cols, long long j) {
  __align__(16) __nv_bfloat16 y[8];
  if constexpr (Act::kType == kBinaryInterleaved) {
    __align__(16) __nv_bfloat16 v[16];
    *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(row + 2 * j);
    *reinterpret_cast<uint4*>(v + 8) = *reinterpret_cast<const uint4*>(row + 2 * j + 8);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      y[i] = __float2bfloat16_rn(Act::f(__bfloat162float(v[2 * i]), __bfloat162float(v[2 * i + 1])));
  } else {
    __align__(16) __nv_bfloat16 va[8];
    __align__(16) __nv_bfloat16 vb[8];
    *reinterpret_cast<uint4*>(va) = *reinterpret_cast<const uint4*>(row + j);
    if constexpr (Act::kType == kBinarySplit) {
      *reinterpret_cast<uint4*>(vb) = *reinterpret_cast<const uint4*>(row + cols + j);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) vb[i] = __float2bfloat16_rn(0.f);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
      y[i] = __float2bfloat16_rn(Act::f(__bfloat162float(va[i]), __bfloat162float(vb[i])));
  }
  return *reinterpret_cast<uint4*>(y);
}

// Programmatic dependent launch (both no-ops in a grid launched without the attribute,
// CHORD_ACTIVATION_PDL): wait for the GEMM before (its output is this kernel's input) before any
// global access, then let the next kernel launch at once, so down's CTAs are resident and a
// pdl_prefetch down GEMM requests its weights while this pass runs.
__device__ __forceinline__ void grid_dependency() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// The valid-row count *num_valid (layout 0 and scatter targets), or no limit.
__device__ __forceinline__ long long num_valid(const ActParams& p) {
  long long nv = 0x7fffffffffffffffLL;
  if (p.num_valid != nullptr)
    nv = p.num_valid_is_64 ? *reinterpret_cast<const long long*>(p.num_valid)
                           : (long long)(*reinterpret_cast<const int*>(p.num_valid));
  return nv;
}

// write(dst_row, ok) for every destination row of input row r (ok == false: write zeros)
template <typename Write>
__device__ __forceinline__ void destinations(const ActParams& p, long long r, bool row_ok, long long nv, Write write) {
  if (p.layout != 2) {
    write(r, row_ok);
    return;
  }
  for (long long c = 0; c < p.scatter_cols; ++c) {
    const long long dst = p.scatter_idx[r * p.scatter_cols + c];
    if (dst < 0 || dst >= p.out_rows) continue;
    const bool ok = dst < nv;
    if (ok || p.zero_invalid) write(dst, ok);
  }
}

// One row per rows_per_cta-th of the CTA: a row's outputs are spread over blockDim.x /
// rows_per_cta threads (lanes), so a narrow row (TP8's 256 outputs: 32 16-byte items) still keeps
// a whole CTA's loads in flight. With `pair`, two rows per thread and pass (r and r + stride),
// their loads issued before either is computed: twice the bytes in flight of one row at a time.
template <class Act>
__device__ __forceinline__ void act_narrow(const ActParams& p) {
  grid_dependency();
  const long long nv = num_valid(p);
  const int lanes = blockDim.x / (int)p.rows_per_cta;
  const int lane = threadIdx.x % lanes;
  const long long stride = (long long)gridDim.x * p.rows_per_cta;
  auto valid = [&](long long r) {
    if (p.layout == 1) {
      const long long e = r / p.max_rows;
      return (r - e * p.max_rows) < (long long)p.expert_tokens[e];
    }
    return p.layout == 0 ? r < nv : true;  // scatter: validity is per destination
  };
  auto store8 = [&](long long r, bool row_ok, long long j, uint4 y) {
    destinations(p, r, row_ok, nv, [&](long long dst, bool ok) {
      *reinterpret_cast<uint4*>(p.out + dst * p.out_stride + j) = ok ? y : make_uint4(0u, 0u, 0u, 0u);
    });
  };
  for (long long r = (long long)blockIdx.x * p.rows_per_cta + threadIdx.x / lanes; r < p.rows;
       r += (p.pair ? 2 : 1) * stride) {
    const long long r2 = r + stride;
    const bool has2 = p.pair && r2 < p.rows;
    const bool ok1 = valid(r);
    const bool ok2 = has2 && valid(r2);
    const bool do1 = ok1 || p.zero_invalid, do2 = has2 && (ok2 || p.zero_invalid);
    if (!do1 && !do2) continue;
    const __nv_bfloat16* row1 = p.in + r * p.in_stride;
    const __nv_bfloat16* row2 = p.in + (has2 ? r2 : r) * p.in_stride;
    if (p.vec) {
      for (long long j = 8LL * lane; j < p.cols; j += 8LL * lanes) {
        const uint4 y1 = ok1 ? compute8<Act>(row1, p.cols, j) : make_uint4(0u, 0u, 0u, 0u);
        const uint4 y2 = ok2 ? compute8<Act>(row2, p.cols, j) : make_uint4(0u, 0u, 0u, 0u);
        if (do1) store8(r, ok1, j, y1);
        if (do2) store8(r2, ok2, j, y2);
      }
    } else {
      for (int h = 0; h < 2; ++h) {
        const long long rr = h ? r2 : r;
        const bool ok = h ? ok2 : ok1;
        if (!(h ? do2 : do1)) continue;
        const __nv_bfloat16* row = h ? row2 : row1;
        for (long long j = lane; j < p.cols; j += lanes) {
          __nv_bfloat16 y = __float2bfloat16_rn(0.f);
          if (ok) {
            float a, b;
            load<Act>(row, p.cols, j, a, b);
            y = __float2bfloat16_rn(Act::f(a, b));
          }
          destinations(p, rr, ok, nv, [&](long long dst, bool okd) {
            p.out[dst * p.out_stride + j] = okd ? y : __float2bfloat16_rn(0.f);
          });
        }
      }
    }
  }
}

// Wide rows (EP's 2048 outputs: 256 16-byte items): one row per CTA, its outputs over the CTA's
// threads, a grid-stride walk over the rows.
template <class Act>
__device__ __forceinline__ void act_wide(const ActParams& p) {
  grid_dependency();
  const long long nv = num_valid(p);
  for (long long r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const __nv_bfloat16* row = p.in + r * p.in_stride;
    bool row_ok = true;  // scatter: validity is per destination
    if (p.layout == 1) {
      const long long e = r / p.max_rows;
      row_ok = (r - e * p.max_rows) < (long long)p.expert_tokens[e];
    } else if (p.layout == 0) {
      row_ok = r < nv;
    }
    if (!row_ok && !p.zero_invalid) continue;
    if (p.vec) {
      for (long long j = 8LL * threadIdx.x; j < p.cols; j += 8LL * blockDim.x) {
        const uint4 y = row_ok ? compute8<Act>(row, p.cols, j) : make_uint4(0u, 0u, 0u, 0u);
        destinations(p, r, row_ok, nv, [&](long long dst, bool ok) {
          *reinterpret_cast<uint4*>(p.out + dst * p.out_stride + j) = ok ? y : make_uint4(0u, 0u, 0u, 0u);
        });
      }
    } else {
      for (long long j = threadIdx.x; j < p.cols; j += blockDim.x) {
        __nv_bfloat16 y = __float2bfloat16_rn(0.f);
        if (row_ok) {
          float a, b;
          load<Act>(row, p.cols, j, a, b);
          y = __float2bfloat16_rn(Act::f(a, b));
        }
        destinations(p, r, row_ok, nv, [&](long long dst, bool ok) {
          p.out[dst * p.out_stride + j] = ok ? y : __float2bfloat16_rn(0.f);
        });
      }
    }
  }
}

}  // namespace act
}  // namespace chord

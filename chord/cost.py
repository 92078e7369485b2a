"""A cost model of one MoE GEMM under one schedule: what `chord tune` ranks candidates by before it
compiles or times any of them.

The model is a roofline with the two effects that separate schedules of one shape:

* **waves** -- a grid of ``units`` CTAs on ``slots`` CTA slots (SMs x CTAs per SM) runs in
  ``ceil(units / slots)`` waves, so the time scales with ``waves * slots / units`` (a half-empty
  last wave costs a whole one);
* **bytes in flight** -- an SM streams its share of the bandwidth only with about
  IN_FLIGHT_BYTES_PER_SM of loads outstanding (Little's law), so a ring of fewer bytes
  (stages x stage bytes x resident CTAs) stretches the memory time;
* **padding** -- a token tile of ``block_m`` rows computes ``block_m`` rows even where the expert
  has fewer, so compute scales with the padded rows.

``predicted_us = max(bytes / BANDWIDTH, flops / rate(main loop)) / wave efficiency`` with the
bytes of the touched experts' int4 weights and scales (0.5625 bytes per weight), the activations
read once per N block column group and the output. It ranks; it does not predict absolute times
(the H200 constants are round numbers of the measured ceilings, docs/performance.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from chord.knobs import K_BLOCK, Problem, Schedule
from chord.selection import token_tiles, touched_experts

SMS = 132
BANDWIDTH_B_PER_US = 4.2e6  # the measured copy ceiling, 4.2 TB/s
RATE_FLOP_PER_US = {"wgmma": 660e6, "mma": 330e6}  # dense bf16 tensor rate of each main loop
BYTES_PER_WEIGHT = 0.5625  # int4 + one bf16 scale per 32
#: bytes one SM keeps in flight to stream its share of 4.2 TB/s at ~1 us of load latency
IN_FLIGHT_BYTES_PER_SM = 32 * 1024


@dataclass(frozen=True)
class Estimate:
    us: float
    memory_us: float
    compute_us: float
    units: int  # CTAs of the grid (token tiles x N blocks x split-K)
    slots: int
    wave_efficiency: float
    padding: float  # padded rows / rows

    def why(self) -> str:
        bound = "memory" if self.memory_us >= self.compute_us else "compute"
        return (f"{self.us:.1f} us predicted ({bound}-bound; {self.units} CTAs on {self.slots} slots, "
                f"{100 * self.wave_efficiency:.0f} % of the waves used, padding {self.padding:.2f}x)")


def estimate(s: Schedule, p: Problem) -> Estimate:
    """The cost model's estimate of `p` under `s` (host integers only)."""
    rows = max(p.rows, 1)
    touched = touched_experts(p.num_experts, rows)
    m_tiles = max(1, token_tiles(p.num_experts, rows, s.block_m, touched))
    grid_n = max(1, s.grid_n(p.n) // max(1, s.n_tiles))
    units = m_tiles * grid_n * s.split_k
    slots = SMS * s.ctas_per_sm
    waves = math.ceil(units / slots)
    # one wave: the SMs that hold a CTA are what streams; more: whole waves of the slots
    eff = min(1.0, units / SMS) if waves == 1 else units / (waves * slots)
    if s.stream_k:  # stream-K splits the work evenly over one wave of the grid
        eff = 1.0
    padded = m_tiles * s.block_m
    weight_bytes = math.ceil(touched) * p.n * p.k * BYTES_PER_WEIGHT
    act_bytes = rows * p.k * 2 * max(1, grid_n // max(1, s.raster or 1) if s.mainloop == "wgmma" else 1)
    out_bytes = rows * p.n * (2 + 8 * (s.split_k - 1))  # split-K: fp32 partials written and read back
    memory_us = (weight_bytes + min(act_bytes, rows * p.k * 2 * 8) + out_bytes) / BANDWIDTH_B_PER_US
    # Little's law: an SM streams at its share of the bandwidth only with enough bytes in flight
    stage_bytes = s.block_n_cta * K_BLOCK * BYTES_PER_WEIGHT + s.block_m * K_BLOCK * 2
    resident = max(1.0, min(units / SMS, s.ctas_per_sm))
    in_flight = resident * s.stages * stage_bytes
    kb_per_ring = (p.k // K_BLOCK) / max(1, s.split_k)  # the K blocks one ring walks
    if s.direct:  # warp-private rings: each warp keeps up to stages - 1 K blocks of its own K share in flight,
        kb_per_ring /= s.warps  # all of them at once when its share is that short (no ring to fill)
        in_flight = resident * s.warps * max(1.0, min(s.stages - 1, kb_per_ring)) * stage_bytes
    memory_us *= max(1.0, IN_FLIGHT_BYTES_PER_SM / in_flight)
    compute_us = 2.0 * padded * p.n * p.k / RATE_FLOP_PER_US[s.mainloop]
    # the tensor pipe waits on copies a shallow ring cannot hide (5-stage wgmma rings timed 5-12 %
    # faster than 3-stage ones at 64-512 rows per expert on the H200, 2026-12-03)
    if s.mainloop == "wgmma":
        compute_us *= 1.0 + 0.04 * max(0, 5 - s.stages)
    # a K loop shorter than the ring never fills it: latency, not bandwidth
    ring_fill = 1.0 if s.direct else min(1.0, kb_per_ring / max(1, s.stages))
    us = max(memory_us, compute_us) / eff / max(ring_fill, 0.5)
    return Estimate(us, memory_us, compute_us, units, slots, eff, padded / rows)


def rank(cands: list[Schedule], p: Problem, limit: int | None = None, per_shape: int = 3) -> list[Schedule]:
    """`cands` ordered by predicted time, at most `per_shape` variants (stages, CTAs per SM, raster,
    fold, ...) of one tile shape (main loop, block_m, block_n, warps, group steps, split-K) in each
    round, so a limited list still spans several shapes; the first `limit` of that order."""
    shapes: dict = {}
    for s in cands:
        key = (s.mainloop, s.block_m, s.block_n, s.warps, s.group_steps, s.split_k, s.stream_k, s.direct)
        shapes.setdefault(key, []).append((estimate(s, p).us, s.id, s))
    ordered = sorted(shapes.values(), key=lambda v: min(x[0] for x in v))
    for v in ordered:
        v.sort(key=lambda x: (x[0], x[1]))
    out: list[Schedule] = []
    for rnd in range(per_shape):
        for v in ordered:
            if rnd < len(v):
                out.append(v[rnd][2])
    rest = [x[2] for v in ordered for x in v[per_shape:]]
    out += sorted(rest, key=lambda s: estimate(s, p).us)
    return out if limit is None else out[:limit]

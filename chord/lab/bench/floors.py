"""Memory and compute floors of a scenario (what no kernel can beat on this GPU).

Per GEMM (gate_up, then down), with ``E_t`` = experts actually touched by the routing:

* memory floor = bytes that must move / measured copy bandwidth, where the bytes are the
  INT4 weights + bf16 group-32 scales of the touched experts, ``E_t * (N*K/2 + N*(K/32)*2)``,
  plus the activations read and written: ``in_rows * K * 2 + rows * N * 2``;
* compute floor = ``2 * rows * N * K`` / measured dense bf16 matmul rate;
* GEMM floor = max(memory floor, compute floor).

The scenario floor is gate_up floor + down floor (two dependent kernels cannot overlap).

``in_rows`` of gate_up is the number of tokens M for the indexed family (its input is
``[M, K]``, each token read once) and the routed rows ``M * top_k`` for the grouped families
(their input is the permuted ``[rows, K]``); down always reads ``rows`` rows.

Differences from the floors in the committed Humming baseline file, with its ceilings (checked
2026-11-29): that file counted ``rows * K`` gate_up input bytes for EP8 indexed too (floors here
are 0.1 % lower at tok_e 1, 1.5 % lower at tok_e 32; grouped families identical); its TP8
routing touched 286 / 383 experts at M = 64 / 256 where ``chord.routing.random_topk_ids`` touches
288 / 384 (+0.7 % / +0.3 %); and it took ``max(total memory, total compute)`` instead of a per-GEMM
max, which differs only where one GEMM is compute-bound and the other memory-bound: tp8-m4096,
520.0 us there, 554.5 us here (gate_up compute-bound, down memory-bound). Everything else agrees
to 0.1 us.
"""
from __future__ import annotations

import dataclasses

from chord.lab.bench.ceilings import Ceilings
from chord.lab.bench.suite import Scenario

GROUP_SIZE = 32


def weight_bytes(n: int, k: int, group_size: int = GROUP_SIZE) -> int:
    """INT4 weight + bf16 scale bytes of one expert ``[N, K]``."""
    return n * k // 2 + n * (k // group_size) * 2


@dataclasses.dataclass(frozen=True)
class GemmFloor:
    name: str
    experts_touched: int
    n: int
    k: int
    rows: int
    in_rows: int
    weight_bytes: int
    activation_bytes: int
    flops: int
    mem_us: float
    compute_us: float

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.activation_bytes

    @property
    def floor_us(self) -> float:
        return max(self.mem_us, self.compute_us)

    @property
    def bound(self) -> str:
        return "memory" if self.mem_us >= self.compute_us else "compute"


def gemm_floor(name: str, experts_touched: int, n: int, k: int, rows: int, in_rows: int,
               ceilings: Ceilings, group_size: int = GROUP_SIZE) -> GemmFloor:
    wb = experts_touched * weight_bytes(n, k, group_size)
    ab = in_rows * k * 2 + rows * n * 2
    flops = 2 * rows * n * k
    return GemmFloor(name, experts_touched, n, k, rows, in_rows, wb, ab, flops,
                     (wb + ab) / ceilings.copy_bytes_per_us, flops / ceilings.flop_per_us)


@dataclasses.dataclass(frozen=True)
class ScenarioFloor:
    gate_up: GemmFloor
    down: GemmFloor

    @property
    def floor_us(self) -> float:
        return self.gate_up.floor_us + self.down.floor_us

    @property
    def bound(self) -> str:
        b = {self.gate_up.bound, self.down.bound}
        return b.pop() if len(b) == 1 else "mixed"

    def as_dict(self) -> dict:
        d = {"floor_us": self.floor_us, "bound": self.bound}
        for g in (self.gate_up, self.down):
            d[g.name] = {**dataclasses.asdict(g), "floor_us": g.floor_us, "bound": g.bound}
        return d


def scenario_floor(scenario: Scenario, ceilings: Ceilings, experts_touched: int,
                   family: str = "indexed") -> ScenarioFloor:
    """Floor of one scenario's gate_up + down under ``family``'s input layout."""
    if not 0 <= experts_touched <= scenario.experts:
        raise ValueError(f"experts_touched must be in [0, {scenario.experts}], got {experts_touched}")
    rows = scenario.rows
    gu_in = scenario.m if family == "indexed" else rows
    gu = gemm_floor("gate_up", experts_touched, scenario.n_gate_up, scenario.k_gate_up, rows, gu_in, ceilings)
    dn = gemm_floor("down", experts_touched, scenario.n_down, scenario.k_down, rows, rows, ceilings)
    return ScenarioFloor(gu, dn)


def pct_of_floor(floor_us: float, time_us: float) -> float:
    """How close a time is to its floor: ``100 * floor / time`` (100 = at the floor)."""
    return 100.0 * floor_us / time_us if time_us > 0 else float("nan")

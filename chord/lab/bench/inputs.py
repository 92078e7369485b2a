"""A scenario's inputs from a seed: routing, activations, expert weights, family layouts.

Chord's run (``chord.lab.bench.runner``) and the Humming baseline subprocess
(``chord.lab.bench.humming_baseline``) both build their inputs here, so a scenario's routing and
data are the same in both processes for the same ``--seed`` on the same device:

* routing: ``chord.routing.balanced_topk_ids`` (EP8: every local expert gets exactly tok_e
  rows) or ``chord.routing.random_topk_ids`` (TP8: top-8 of normal scores), drawn on the CPU
  from a generator seeded with ``routing_seed`` (= M for seed 0, as the suite says);
* activations: ``x [M, K]`` and the down input ``[M*top_k, I]`` (bf16, standard normal) from a
  generator on the target device;
* weights: random INT4 codes and bf16 group scales built directly on the device (no float
  weights, no quantizer: fast even for the 1.2 GB EP8 set), once per deployment;
* ``FamilyInputs``: the gate_up / down inputs of one family in its layout (indexed: the
  tokens and the flat routed rows; grouped_contiguous: rows permuted per expert with
  *unaligned* offsets, as vLLM's ``moe_prepare_scatter``; grouped_masked: ``[E, max_rows, K]``)
  and, for every layout row, the flat route ``token * top_k + j`` it holds;
* the float32 reference of a sample of routes (``chord.reference``, on the sampled rows only).

Only torch, ``chord.routing``, ``chord.formats`` and ``chord.reference`` are imported (plain torch), so the
Humming subprocess can use this module without touching Chord's kernels or its ``humming`` shim.
"""
from __future__ import annotations

import dataclasses
import math
import torch

from chord.lab.bench.suite import Scenario

SEED_STRIDE = 1_000_003
# mean of q^2 over uniform INT4 codes in [-8, 7] (344 / 16): sets the scale so outputs are O(1)
_Q2_MEAN = 21.5
CODE_RANGES = {"full": (-8, 7), "sym7": (-7, 7)}


def routing_seed(scenario: Scenario, base_seed: int = 0) -> int:
    """Seed of a scenario's routing: M for ``base_seed`` 0 (the suite's rule), fresh per base seed."""
    return int(base_seed) * SEED_STRIDE + scenario.m


def weights_seed(scenario: Scenario, base_seed: int = 0) -> int:
    """Seed of a deployment's weights (shared by all scenarios of that deployment)."""
    return int(base_seed) * SEED_STRIDE + 7919 * scenario.experts + scenario.n_gate_up + 17 * scenario.k_down


def make_topk_ids(scenario: Scenario, base_seed: int = 0, device: torch.device | str | None = None) -> torch.Tensor:
    """int32 ``[M, top_k]`` routing of the scenario (generated on the CPU, moved to ``device``)."""
    from chord import routing

    seed = routing_seed(scenario, base_seed)
    if scenario.balanced:
        ids = routing.balanced_topk_ids(scenario.m, scenario.experts, scenario.top_k, scenario.tok_e, seed)
    else:
        ids = routing.random_topk_ids(scenario.m, scenario.experts, scenario.top_k, seed)
    return ids.to(device) if device is not None else ids


def _generator(device: torch.device, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(int(seed) % (2**63))
    return g


@dataclasses.dataclass
class ScenarioData:
    """Per-scenario tensors shared by every family (and by Chord's and Humming's runs)."""

    scenario: Scenario
    topk_ids: torch.Tensor  # int32 [M, top_k] on device
    x: torch.Tensor  # bf16 [M, K_gate_up]
    down_in: torch.Tensor  # bf16 [M*top_k, K_down], row = flat route id
    seed: int

    @property
    def device(self) -> torch.device:
        return self.x.device

    def experts_touched(self) -> int:
        return int(torch.unique(self.topk_ids.long()).numel())


def scenario_data(scenario: Scenario, base_seed: int = 0, device: torch.device | str = "cpu") -> ScenarioData:
    device = torch.device(device)
    seed = routing_seed(scenario, base_seed)
    topk_ids = make_topk_ids(scenario, base_seed, device)
    g = _generator(device, seed + 1)
    x = torch.randn(scenario.m, scenario.k_gate_up, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
    down_in = torch.randn(scenario.rows, scenario.k_down, generator=g, device=device,
                          dtype=torch.float32).to(torch.bfloat16)
    return ScenarioData(scenario, topk_ids, x, down_in, seed)


@dataclasses.dataclass
class ExpertWeights:
    """Plain INT4 codes (int8 [E, N, K]) and bf16 group-32 scales ([E, N, K/32]) of w13 and w2."""

    q13: torch.Tensor
    s13: torch.Tensor
    q2: torch.Tensor
    s2: torch.Tensor
    codes: str = "full"

    @property
    def nbytes_int4(self) -> int:
        """Bytes of the INT4 weights + bf16 scales (what a kernel streams for all experts)."""
        return (self.q13.numel() + self.q2.numel()) // 2 + (self.s13.numel() + self.s2.numel()) * 2


def random_int4(experts: int, n: int, k: int, generator: torch.Generator, device: torch.device,
                codes: str = "full") -> tuple[torch.Tensor, torch.Tensor]:
    """Random INT4 codes in the ``codes`` range and positive bf16 scales (output std about 1)."""
    if codes not in CODE_RANGES:
        raise ValueError(f"codes must be one of {sorted(CODE_RANGES)}, got {codes!r}")
    lo, hi = CODE_RANGES[codes]
    q = torch.randint(lo, hi + 1, (experts, n, k), generator=generator, device=device, dtype=torch.int8)
    base = 1.0 / math.sqrt(k * _Q2_MEAN)
    s = (torch.rand(experts, n, k // 32, generator=generator, device=device) + 0.5) * base
    return q, s.to(torch.bfloat16)


def expert_weights(scenario: Scenario, base_seed: int = 0, device: torch.device | str = "cpu",
                   codes: str = "full") -> ExpertWeights:
    """The deployment's w13 ``[E, n_gate_up, k_gate_up]`` and w2 ``[E, n_down, k_down]``.

    ``codes``: "full" draws codes from all of [-8, 7] (what ``chord.formats`` allows and what a
    compressed-tensors quantizer with divisor 7.5 produces); "sym7" from [-7, 7] only (a
    checkpoint quantized with divisor 7). Humming converts [-7, 7] weights to a sign-magnitude
    type internally (``convert_symmetric_integer_weight``), so the choice picks its dequant path.
    """
    device = torch.device(device)
    g = _generator(device, weights_seed(scenario, base_seed))
    q13, s13 = random_int4(scenario.experts, scenario.n_gate_up, scenario.k_gate_up, g, device, codes)
    q2, s2 = random_int4(scenario.experts, scenario.n_down, scenario.k_down, g, device, codes)
    return ExpertWeights(q13, s13, q2, s2, codes)


@dataclasses.dataclass
class FamilyInputs:
    """Inputs of one family's gate_up and down GEMMs, and which route each output row holds.

    ``gate_up_in``: indexed ``[M, K]`` (tokens); contiguous ``[rows, K]``; masked
    ``[E, max_rows, K]``. ``down_in`` has the layout of the gate_up output. ``row_route``
    (int64, same leading shape as the outputs) is the flat route of each output row, -1 for
    padding rows. ``expert_offsets`` / ``expert_num_tokens`` are set for the grouped families.
    """

    family: str
    gate_up_in: torch.Tensor
    down_in: torch.Tensor
    row_route: torch.Tensor
    expert_offsets: torch.Tensor | None = None
    expert_num_tokens: torch.Tensor | None = None

    @property
    def out_rows_shape(self) -> tuple[int, ...]:
        return tuple(self.row_route.shape)


def family_inputs(family: str, data: ScenarioData, *, contiguous_alignment: int = 1) -> FamilyInputs:
    """Lay the scenario's data out for ``family`` with ``chord.routing``.

    grouped_contiguous uses ``alignment=contiguous_alignment`` (1 = unaligned offsets, as vLLM's
    ``moe_prepare_scatter`` hands them to Humming); grouped_masked uses ``masked_layout``'s
    default ``max_rows`` (the largest expert count), the same in both processes.
    """
    from chord import routing

    sc = data.scenario
    e = sc.experts
    if family == "indexed":
        rr = torch.arange(sc.rows, device=data.device, dtype=torch.int64)
        return FamilyInputs(family, data.x, data.down_in, rr)
    if family == "grouped_contiguous":
        lay = routing.contiguous_layout(data.x, data.topk_ids, e, alignment=contiguous_alignment)
        down = torch.where((lay.src_slot >= 0).unsqueeze(1), data.down_in[lay.src_slot.clamp(min=0)],
                           data.down_in.new_zeros(()))
        return FamilyInputs(family, lay.x, down.contiguous(), lay.src_slot, expert_offsets=lay.expert_offsets)
    if family == "grouped_masked":
        lay = routing.masked_layout(data.x, data.topk_ids, e)
        down = torch.where((lay.src_slot >= 0).unsqueeze(-1), data.down_in[lay.src_slot.clamp(min=0)],
                           data.down_in.new_zeros(()))
        return FamilyInputs(family, lay.x, down.contiguous(), lay.src_slot, expert_num_tokens=lay.expert_num_tokens)
    raise ValueError(f"unknown family {family!r}")


def scenario_for(suite_path, scenario_id: str, family: str, who: str = "scenario") -> Scenario:
    """The suite's scenario `scenario_id`, checked to run `family` (a clear error naming both)."""
    from chord.lab.bench.suite import load_suite

    sc = load_suite(suite_path).scenario(scenario_id)
    if family not in sc.families:
        raise ValueError(f"{who}: scenario {scenario_id} runs families {sc.families}, got {family!r}")
    return sc


def one_scenario(suite_path, scenario_id: str, family: str, base_seed: int = 0, device: torch.device | str = "cuda",
                 who: str = "scenario"):
    """(scenario, packed w13, packed w2, ScenarioData, FamilyInputs) of one suite scenario and
    family: what `chord tune`'s time_schedules and `chord capture` run (the bench's inputs)."""
    from chord import formats

    sc = scenario_for(suite_path, scenario_id, family, who)
    dev = torch.device(device)
    ew = expert_weights(sc, base_seed, dev)
    w13, w2 = formats.pack_experts(ew.q13, ew.s13), formats.pack_experts(ew.q2, ew.s2)
    del ew
    data = scenario_data(sc, base_seed, dev)
    return sc, w13, w2, data, family_inputs(family, data)


def sample_routes(rows: int, max_rows: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Sorted int64 route ids to check: all of them when ``rows <= max_rows``, else a random subset."""
    if rows <= max_rows:
        return torch.arange(rows, dtype=torch.int64, device=device)
    g = torch.Generator().manual_seed(int(seed) + 12345)
    return torch.randperm(rows, generator=g)[:max_rows].sort().values.to(device)


def rows_of_routes(fi: FamilyInputs, routes: torch.Tensor) -> torch.Tensor:
    """Flat output-row index (into ``out.reshape(-1, N)``) of each route in ``routes``."""
    flat = fi.row_route.reshape(-1)
    inv = torch.full((int(flat.max().item()) + 2 if flat.numel() else 1,), -1, dtype=torch.int64, device=flat.device)
    pos = torch.arange(flat.numel(), device=flat.device)
    valid = flat >= 0
    inv[flat[valid]] = pos[valid]
    got = inv[routes.to(flat.device)]
    if bool((got < 0).any()):
        raise RuntimeError(f"{fi.family}: some checked routes have no output row (layout lost routes)")
    return got


def reference_routes(q: torch.Tensor, scales: torch.Tensor, inputs: torch.Tensor,
                     experts: torch.Tensor) -> torch.Tensor:
    """float32 ``[S, N]``: ``inputs[s] @ dequant(W[experts[s]])^T`` for a sample of routes.

    Computed with ``chord.reference.contiguous_gemm_ref`` on the sampled rows sorted by expert
    (the same float32 math as every reference op, on S rows instead of all of them).
    """
    from chord.reference import contiguous_gemm_ref

    experts = experts.to(inputs.device).long()
    order = torch.argsort(experts, stable=True)
    counts = torch.bincount(experts, minlength=q.shape[0])
    offsets = torch.zeros(q.shape[0] + 1, dtype=torch.int64, device=inputs.device)
    torch.cumsum(counts, 0, out=offsets[1:])
    ref_sorted = contiguous_gemm_ref(inputs[order].contiguous(), q, scales, offsets)
    out = torch.empty_like(ref_sorted)
    out[order] = ref_sorted
    return out


def route_experts(topk_ids: torch.Tensor, routes: torch.Tensor) -> torch.Tensor:
    return topk_ids.reshape(-1).long()[routes.to(topk_ids.device)]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative Frobenius error ``||got - want|| / ||want||`` in float64 (NaN/inf -> inf)."""
    g = got.double()
    w = want.double()
    if not bool(torch.isfinite(g).all()):
        return float("inf")
    den = torch.linalg.vector_norm(w).item()
    num = torch.linalg.vector_norm(g - w).item()
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


def gemm_check(fi: FamilyInputs, data: ScenarioData, weights: ExpertWeights, gemm: str,
               routes: torch.Tensor):
    """A function ``out -> relative error`` of one GEMM's output (``gemm``: "gate_up" or "down")
    against the float32 reference on ``routes`` (the reference is computed once)."""
    if gemm not in ("gate_up", "down"):
        raise ValueError(f"gemm_check: gemm must be 'gate_up' or 'down', got {gemm!r}")
    sc = data.scenario
    ex = route_experts(data.topk_ids, routes)
    r = routes.to(data.device)
    if gemm == "gate_up":
        want = reference_routes(weights.q13, weights.s13, data.x[r // sc.top_k], ex)
    else:
        want = reference_routes(weights.q2, weights.s2, data.down_in[r], ex)
    rows = rows_of_routes(fi, r)
    return lambda out: rel_err(out.reshape(-1, out.shape[-1])[rows], want)


def check_family_outputs(fi: FamilyInputs, data: ScenarioData, weights: ExpertWeights,
                         gate_up_out: torch.Tensor, down_out: torch.Tensor,
                         routes: torch.Tensor) -> tuple[float, float]:
    """Relative errors of gate_up and down outputs against the float32 reference on ``routes``."""
    return (gemm_check(fi, data, weights, "gate_up", routes)(gate_up_out),
            gemm_check(fi, data, weights, "down", routes)(down_out))


# Pass bound of the relative Frobenius error (bf16 operands and output, fp32 accumulation): bf16
# output rounding alone gives ~1e-3; 1e-2 is the upper end of the CONVENTIONS range.
TOLERANCE = 1e-2


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with NaN before a kernel runs (rows a kernel forgets stay NaN)."""
    return t.fill_(float("nan"))


def describe_touched(topk_ids: torch.Tensor, num_experts: int) -> dict:
    counts = torch.bincount(topk_ids.reshape(-1).long().cpu(), minlength=num_experts)
    return {"experts_touched": int((counts > 0).sum()), "max_rows_per_expert": int(counts.max()),
            "min_rows_per_expert": int(counts.min())}

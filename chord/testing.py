"""Helpers shared by the tests, the benchmark and the tuner: random INT4 experts, poisoned
outputs, relative error and the bf16 tolerance.

Plain torch only (no kernels), so CPU tests import it too.
"""
from __future__ import annotations

import torch

from chord import formats
from chord._env import tile_group_max

#: relative Frobenius error allowed for bf16 operands against the float32 reference; measured
#: ~2-3e-3 on every family and main loop.
BF16_TOL = 1e-2


def random_experts(e: int, n: int, k: int, seed: int = 0, device: str | torch.device = "cuda"
                   ) -> tuple[formats.QuantizedExperts, formats.PackedExperts]:
    """Random non-zero INT4 codes in [-8, 7] with bf16 group scales, and their packed form."""
    g = torch.Generator(device=device).manual_seed(1000 + seed)
    q = torch.randint(-8, 8, (e, n, k), dtype=torch.int8, device=device, generator=g)
    q[q == 0] = 1
    s = (torch.rand(e, n, k // 32, device=device, generator=g) * 0.02 + 0.002).to(torch.bfloat16)
    qe = formats.QuantizedExperts(q, s)
    return qe, formats.pack_experts(qe)


def poisoned(*shape: int, device: str | torch.device = "cuda") -> torch.Tensor:
    """A bf16 output buffer full of NaN: an element the kernel does not write stays NaN."""
    return torch.full(shape, float("nan"), dtype=torch.bfloat16, device=device)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """‖got − ref‖ / ‖ref‖ in float32; NaN in `got` (an unwritten element) fails at once."""
    if torch.isnan(got).any():
        raise AssertionError("NaN in the kernel output (unwritten rows?)")
    return ((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical bf16 tensors (NaN patterns included)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16))


def check_rows(out: torch.Tensor, ref: torch.Tensor, valid: torch.Tensor | None = None, what: str = "",
               tol: float = BF16_TOL) -> float:
    """Checks a poisoned (NaN-filled) kernel output against its float32 reference, row by row: the
    rows `valid` names match `ref` within `tol` (`rel_err`), every other row is still NaN (the
    kernel did not write it). `valid`: a bool mask over the leading dims of `out` (default: the
    rows where `ref` is not NaN, as chord.reference leaves the rows an op must not write).
    Raises AssertionError starting with `what`; returns the relative error (0.0 without valid rows)."""
    if valid is None:
        valid = ~torch.isnan(ref[..., 0])
    head = f"{what}: " if what else ""
    if not torch.isnan(out[~valid]).all():
        raise AssertionError(f"{head}rows the routing does not name were written")
    if not valid.any():
        return 0.0
    got = out[valid]
    if torch.isnan(got).any():
        raise AssertionError(f"{head}rows the routing names were not written (NaN left in the output)")
    err = rel_err(got, ref[valid])
    if not err < tol:
        raise AssertionError(f"{head}rel_err {err:.2e} >= {tol:.0e}")
    return err


def run_cases(case, count: int, name=lambda i: f"case {i}", after=None) -> tuple[int, list[str]]:
    """Runs ``case(i)`` for i in 0..count-1 (then ``after()``, e.g. ``torch.cuda.synchronize`` so an
    asynchronous fault is reported against its case) and returns (how many ran, one line per failed
    case, starting with ``name(i)``). A failed case does not stop the others; an error that leaves
    the CUDA context unusable (a message with "CUDA error": an illegal access, a launch failure)
    stops the run there, since every later case would only repeat it."""
    failed: list[str] = []
    ran = 0
    for i in range(count):
        ran += 1
        try:
            case(i)
            if after is not None:
                after()
        except Exception as exc:  # noqa: BLE001 - every error is that case's failure
            first = (str(exc).splitlines() or [""])[0]
            kind = "" if isinstance(exc, AssertionError) else f"{type(exc).__name__}: "
            failed.append(f"{name(i)}: {kind}{first}")
            if "CUDA error" in str(exc):
                break
    return ran, failed


def random_expert_map(e_global: int, e_local: int, device: str | torch.device = "cuda") -> torch.Tensor:
    """An expert-parallel `expert_map`: `e_local` random global experts get local ids 0..e_local-1,
    the others -1 (not on this rank)."""
    emap = torch.full((e_global,), -1, dtype=torch.int32, device=device)
    local = torch.randperm(e_global, device=device)[:e_local]
    emap[local] = torch.arange(e_local, dtype=torch.int32, device=device)
    return emap


_EXPERTS: dict = {}


def cached_random_experts(e: int, n: int, k: int, seed: int = 0, keep: int = 4,
                          device: str | torch.device = "cuda"
                          ) -> tuple[formats.QuantizedExperts, formats.PackedExperts]:
    """`random_experts` (on the GPU unless `device` says otherwise), memoized per shape, seed,
    device and tile-group cap (``CHORD_TILE_GROUP``: the packed layout depends on it, so weights
    packed under another cap are never returned). Kimi K2 shapes are large: at most `keep` + 1
    entries stay alive."""
    key = (e, n, k, seed, str(torch.device(device)), tile_group_max())
    if key not in _EXPERTS:
        if len(_EXPERTS) > keep:
            _EXPERTS.clear()
        _EXPERTS[key] = random_experts(e, n, k, seed, device=device)
    return _EXPERTS[key]


def check_indexed_graph_replay(schedule, e: int, n: int, k: int, m: int, top_k: int, *,
                               seeds: tuple = (2, 3), tol: float = BF16_TOL) -> None:
    """Captures one indexed call of `schedule` into a CUDA graph, then for each seed writes new
    routing values into the captured buffers, replays, and checks the new answer against the
    float32 reference (the op never reads routing on the host, so a replay must follow them)."""
    from chord import ops, reference, routing

    qe, pw = cached_random_experts(e, n, k)
    bm = schedule.block_m
    cap = routing.sorted_ids_capacity(m * top_k, bm, e)

    def route(seed):
        return routing.align_block_size(routing.random_topk_ids(m, e, top_k, seed=seed, device="cuda"), bm, e,
                                        max_num_tokens_padded=cap)

    r0 = route(1)
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = poisoned(m * top_k, n)
    ops.gemm_indexed(x, pw, r0, top_k=top_k, out=out, schedule=schedule)  # warm-up: load the module
    torch.cuda.synchronize()
    assert rel_err(out, reference.indexed_gemm_ref(x, qe, None, r0, top_k)) < tol
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ops.gemm_indexed(x, pw, r0, top_k=top_k, out=out, schedule=schedule)
    for seed in seeds:
        r1 = route(seed)
        r0.sorted_ids.copy_(r1.sorted_ids)
        r0.expert_ids.copy_(r1.expert_ids)
        r0.num_tokens_post_padded.copy_(r1.num_tokens_post_padded)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert rel_err(out, reference.indexed_gemm_ref(x, qe, None, r1, top_k)) < tol, f"{schedule.id} seed {seed}"


def profile_rule_schedules(ns: tuple = (512,), family: str | None = None, profile_file: str = "h200") -> list:
    """Every schedule a rule of the profile gives, fitted to each N of `ns` (of `family`, or all),
    once each, sorted by id: what the GPU tests walk to cover the profile."""
    from chord.schedule import _fit_schedule, load_profile_file

    out: dict = {}
    for prof in load_profile_file(profile_file).deployments.values():
        for fam, rules in prof.rules.items():
            if family is not None and fam != family:
                continue
            for rule in rules:
                for n in ns:
                    s = _fit_schedule(fam, rule.schedule, n)
                    out.setdefault(s.id, s)
    return sorted(out.values(), key=lambda s: s.id)


#: the schedules `direct_one_token_profile` puts on TP8 one token (gate_up, down)
DIRECT_ONE_TOKEN = ("idx-m8n32k64-w8-s8-c1-dr1", "idx-m8n128k64-w4-s2-c1-dr1")


def direct_one_token_profile(path) -> str:
    """Writes to `path` a copy of the H200 profile whose two TP8 one-token rules (down's, then
    gate_up's) are the direct loop's candidates DIRECT_ONE_TOKEN, and returns the path as a string
    (a profile file for `chord bench` / `chord stamps` / chord.lab.stamps.run_point)."""
    import json
    from pathlib import Path

    from chord import _resources

    prof = json.loads(Path(_resources.profiles_dir(), "h200.json").read_text())
    rules = prof["deployments"]["tp8"]["families"]["indexed"]
    if rules[0].get("k_max") != 256 or "k_max" in rules[1]:
        raise ValueError("direct_one_token_profile: the H200 profile's TP8 rules no longer start with down's and "
                         "gate_up's one-token rules")
    common = {"max_rows_per_expert": rules[0]["max_rows_per_expert"], "block_m": 8, "ctas_per_sm": 1, "direct": 1,
              "why": "chord.testing.direct_one_token_profile: the direct loop's TP8 one-token candidates"}
    rules[0] = dict(common, block_n=128, warps=4, stages=2, k_max=256)
    rules[1] = dict(common, block_n=32, warps=8, stages=8)
    Path(path).write_text(json.dumps(prof))
    return str(path)

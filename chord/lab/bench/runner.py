"""``chord bench``: run a suite, check, time, judge against floors and against Humming.

With a CUDA GPU, for every selected scenario and family:

1. inputs from the seed (``chord.lab.bench.inputs``): routing, activations, and the deployment's
   INT4 weights (built once per deployment, packed once with ``chord.formats.pack_experts``);
2. the schedule of each GEMM from the deployment's profile (``chord.schedule.select``); for the
   indexed family the routing is aligned with that schedule's ``block_m`` (a second alignment for
   down when its block differs, as vLLM does);
3. outputs poisoned with NaN, one call of gate_up and down, relative Frobenius error of each
   against ``chord.reference`` on a sample of routed rows (``--check-rows``);
4. ``do_bench`` of gate_up + down (kernels only: captured once into a CUDA graph and timed as
   graph replays unless ``--no-cuda-graph``), and of each alone;
5. floors from the ceilings measured at the start of the run (``chord.lab.bench.floors``).

Then Humming: with ``--humming-dir`` the upstream baseline runs in a subprocess
(``python -P -m chord.lab.bench.humming_worker``, upstream dir first on ``PYTHONPATH``:
:mod:`chord.lab.bench.humming_baseline`) on the same
scenarios, seed and GPU, and its rows are merged; without it, the numbers of the committed
baseline file are shown under their own provider name, never mixed up with live numbers.

Result rows are long-format dicts: provider, scenario, family, metric, p20/p50/p80, unit, gpu,
commit, timestamp, schedule ids, plus shape columns (M, rows, tok_e, deployment, ...).

Without a GPU, ``chord bench`` says so on its first line and runs the float32 reference path on
scaled-down EP8 decode / prefill scenarios instead, checking every reference op against a dense
per-expert computation.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, TextIO

from chord import _env
from chord.lab.bench import floors as F
from chord.lab.bench import humming_baseline as HB
from chord.lab.bench import inputs as I
from chord.lab.bench import report, timing
from chord.lab.bench.suite import (DEFAULT_BASELINE, Scenario, cpu_scenarios, load_suite, recorded_path,
                                   scenarios_by_weights)

PROVIDER_CHORD = "chord"
PROVIDER_HUMMING = HB.PROVIDER
PROVIDER_COMMITTED = f"{HB.PROVIDER} [committed file, not run]"
QUICK_SCENARIOS = ("ep8-decode-tok4", "ep8-prefill-tok128", "tp8-m1", "tp8-m1024")
REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclasses.dataclass
class BenchOptions:
    suite: str | None = None
    scenarios: str | None = None
    families: str | None = None
    humming_dir: str | None = None
    out_dir: str = "bench-out"
    quick: bool = False
    seed: int = 0
    check_rows: int = 512
    profile_file: str = "h200"
    codes: str = "full"
    humming_tuning_rows: str = "all"
    baseline_file: str = str(DEFAULT_BASELINE)
    cuda_graph: bool = True
    chain: bool = True  # also time the provider-owned chain (vllm_sequence.prepare_chain) of both libraries

    @property
    def warmup_ms(self) -> float:
        return 10.0 if self.quick else timing.WARMUP_MS

    @property
    def rep_ms(self) -> float:
        return 60.0 if self.quick else timing.REP_MS


# ---------------------------------------------------------------------------------------------
# Chord's API, in one place (a rename upstream is a one-line change here)


class ChordAPI:
    # The launch path serving uses: routing built on the device and trusted (no host read per
    # call, as the humming root and upstream Humming); the outputs are still checked below.
    @staticmethod
    def pack(q, scales):
        from chord import formats

        return formats.pack_experts(formats.QuantizedExperts(q, scales))

    @staticmethod
    def profile(file: str, where):
        """The profile a suite scenario runs under (its deployment by shape, its role), or a
        profile entry by name (``"ep8-decode"``)."""
        from chord import schedule

        if isinstance(where, str):
            return schedule.load_profile(f"{file}:{where}")
        return where.profile(file)

    @staticmethod
    def select(profile, family: str, experts: int, n: int, k: int, rows: int, top_k: int = 1):
        from chord import schedule

        return schedule.select(profile, schedule.Problem(family, experts, n, k, rows, top_k))

    @staticmethod
    def align(topk_ids, block_m: int, experts: int):
        from chord import routing

        return routing.align_block_size(topk_ids, block_m, experts)

    @staticmethod
    def gemm_indexed(x, w, r, top_k, out, schedule):
        from chord import ops

        return ops.gemm_indexed(x, w, r, top_k=top_k, out=out, schedule=schedule, check_routing=False)

    @staticmethod
    def gemm_contiguous(x, w, offsets, out, schedule):
        from chord import ops

        return ops.gemm_contiguous(x, w, offsets, out=out, schedule=schedule, check_routing=False)

    @staticmethod
    def gemm_masked(x, w, counts, out, schedule):
        from chord import ops

        return ops.gemm_masked(x, w, counts, out=out, schedule=schedule, check_routing=False)


# ---------------------------------------------------------------------------------------------
# helpers


def _policy_name() -> str:
    from chord.schedule import current_policy

    return current_policy().name


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def git_commit(root: Path = REPO_ROOT) -> str:
    """The checkout's commit (+dirty), or $CHORD_COMMIT where the tree has no .git (a copied tree)."""
    env = _env.get("CHORD_COMMIT")
    if env:
        return env
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def make_row(provider: str, sc: Scenario, family: str, metric: str, p20, p50, p80, unit: str,
             common: dict, **extra) -> dict:
    row = {"provider": provider, "scenario": sc.id, "family": family, "metric": metric,
           "p20": p20, "p50": p50, "p80": p80, "unit": unit, "deployment": sc.deployment,
           "M": sc.m, "rows": sc.rows, "tok_e": sc.tok_e, "rows_per_expert": sc.rows_per_expert}
    row.update(common)
    row.update(extra)
    return row


def floor_rows(provider: str, sc: Scenario, family: str, fl: F.ScenarioFloor, t: dict | None,
               common: dict, **extra) -> list[dict]:
    """floor_us and pct_of_floor rows (pct p20 from the p80 time, so p20 <= p50 <= p80)."""
    out = [make_row(provider, sc, family, "floor_us", fl.floor_us, fl.floor_us, fl.floor_us, "us", common,
                    bound=fl.bound, **extra)]
    if t is not None and t.get("p50"):
        pct = [F.pct_of_floor(fl.floor_us, t[q]) for q in ("p80", "p50", "p20")]
        out.append(make_row(provider, sc, family, "pct_of_floor", *pct, "%", common, bound=fl.bound, **extra))
    return out


def _print(out: TextIO, msg: str = "") -> None:
    print(msg, file=out, flush=True)


# ---------------------------------------------------------------------------------------------
# GPU path: Chord


def scenario_schedules(family: str, sc: Scenario, profile):
    """(gate_up, down) schedules the bench launches for `sc` x `family` (host integers only)."""
    e = sc.experts
    top_k = sc.top_k if family == "indexed" else 1
    return (ChordAPI.select(profile, family, e, sc.n_gate_up, sc.k_gate_up, sc.rows, top_k),
            ChordAPI.select(profile, family, e, sc.n_down, sc.k_down, sc.rows, 1))


def _chord_calls(family: str, sc: Scenario, data: I.ScenarioData, fi: I.FamilyInputs, w13, w2, profile,
                 schedules=None):
    """(gate_up, down, gate_up output, down output, info) of the scenario's calls; `schedules`:
    (gate_up, down) Schedules to run instead of the profile's (a notebook's pair ablation)."""
    import torch

    api = ChordAPI
    dev = data.device
    e = sc.experts
    s1, s2 = schedules if schedules is not None else scenario_schedules(family, sc, profile)
    if family == "indexed":
        r1 = api.align(data.topk_ids, s1.block_m, e)
        r2 = r1 if s2.block_m == s1.block_m else api.align(data.topk_ids, s2.block_m, e)
        gu = torch.empty(sc.rows, sc.n_gate_up, dtype=torch.bfloat16, device=dev)
        dn = torch.empty(sc.rows, sc.n_down, dtype=torch.bfloat16, device=dev)
        x, dn_in = fi.gate_up_in, fi.down_in

        def gate_up():
            api.gemm_indexed(x, w13, r1, sc.top_k, gu, s1)

        def down():
            api.gemm_indexed(dn_in, w2, r2, 1, dn, s2)
    else:
        lead = fi.gate_up_in.shape[:-1]
        gu = torch.empty(*lead, sc.n_gate_up, dtype=torch.bfloat16, device=dev)
        dn = torch.empty(*lead, sc.n_down, dtype=torch.bfloat16, device=dev)
        x, dn_in = fi.gate_up_in, fi.down_in
        if family == "grouped_contiguous":
            def gate_up():
                api.gemm_contiguous(x, w13, fi.expert_offsets, gu, s1)

            def down():
                api.gemm_contiguous(dn_in, w2, fi.expert_offsets, dn, s2)
        else:
            def gate_up():
                api.gemm_masked(x, w13, fi.expert_num_tokens, gu, s1)

            def down():
                api.gemm_masked(dn_in, w2, fi.expert_num_tokens, dn, s2)
    info = {"schedule_gate_up": s1.id, "schedule_down": s2.id, "block_m": [s1.block_m, s2.block_m]}
    return gate_up, down, gu, dn, info


def measure_family(provider: str, sc: Scenario, family: str, data: I.ScenarioData, weights: I.ExpertWeights,
                   fi: I.FamilyInputs, calls, fl: F.ScenarioFloor, common: dict, opts: BenchOptions,
                   log: Callable[[str], None]) -> list[dict]:
    """Check, time and judge one family's gate_up + down; returns its result rows."""
    import torch

    gate_up, down, gu, dn, info = calls
    extra = dict(info)
    I.poison_(gu)
    I.poison_(dn)
    gate_up()
    down()
    torch.cuda.synchronize()
    routes = I.sample_routes(sc.rows, opts.check_rows, data.seed, data.device)
    e_gu, e_dn = I.check_family_outputs(fi, data, weights, gu, dn, routes)
    ok = e_gu <= I.TOLERANCE and e_dn <= I.TOLERANCE
    extra["check"] = "pass" if ok else "FAIL"
    rows = [make_row(provider, sc, family, "rel_err_gate_up", e_gu, e_gu, e_gu, "1", common, **extra),
            make_row(provider, sc, family, "rel_err_down", e_dn, e_dn, e_dn, "1", common, **extra)]

    def both():
        gate_up()
        down()

    kw = dict(warmup_ms=opts.warmup_ms, rep_ms=opts.rep_ms, graph=opts.cuda_graph)
    t = timing.bench(both, **kw)
    rows.append(make_row(provider, sc, family, "time_us", t.p20, t.p50, t.p80, "us", common, timing=t.method,
                         **extra))
    t_gu = timing.bench(gate_up, **kw)
    t_dn = timing.bench(down, **kw)
    rows.append(make_row(provider, sc, family, "gate_up_us", t_gu.p20, t_gu.p50, t_gu.p80, "us", common,
                         timing=t_gu.method, **extra))
    rows.append(make_row(provider, sc, family, "down_us", t_dn.p20, t_dn.p50, t_dn.p80, "us", common,
                         timing=t_dn.method, **extra))
    rows += floor_rows(provider, sc, family, fl, t.as_dict(), common, **extra)
    log(f"{provider:6s} {sc.id:20s} {family:18s} {t.p50:9.1f} us  {F.pct_of_floor(fl.floor_us, t.p50):5.1f}% of floor"
        f"  err {e_gu:.1e}/{e_dn:.1e} {extra['check']}  {info.get('schedule_gate_up', '')}")
    return rows


def run_chord_gpu(selected, opts: BenchOptions, ceilings, common: dict, log) -> list[dict]:
    import torch

    dev = torch.device("cuda")
    rows: list[dict] = []
    for group in scenarios_by_weights(selected):
        sc0 = group[0][0]
        t0 = time.time()
        weights = I.expert_weights(sc0, opts.seed, dev, codes=opts.codes)
        w13 = ChordAPI.pack(weights.q13, weights.s13)
        w2 = ChordAPI.pack(weights.q2, weights.s2)
        log(f"chord  {sc0.deployment}: weights built and packed in {time.time() - t0:.1f}s")
        layers = _chord_humming_layers(group, weights, opts, dev) if opts.chain else None
        for sc, fams in group:
            data = I.scenario_data(sc, opts.seed, dev)
            touched = I.describe_touched(data.topk_ids, sc.experts)
            profile = ChordAPI.profile(opts.profile_file, sc)
            for fam in fams:
                fl = F.scenario_floor(sc, ceilings, touched["experts_touched"], fam)
                base = dict(common, profile=profile.name, role=profile.role, **touched)
                try:
                    fi = I.family_inputs(fam, data)
                    calls = _chord_calls(fam, sc, data, fi, w13, w2, profile)
                    rows += measure_family(PROVIDER_CHORD, sc, fam, data, weights, fi, calls, fl, base, opts, log)
                    if layers is not None:
                        rows += measure_chain(sc, fam, data, fi, layers, base, opts, log)
                except Exception as exc:  # report and keep going
                    log(f"chord  {sc.id} {fam}: ERROR {type(exc).__name__}: {exc}")
                    rows.append(make_row(PROVIDER_CHORD, sc, fam, "error", None, None, None, "", base,
                                         error=f"{type(exc).__name__}: {exc}"))
                    rows += floor_rows(PROVIDER_CHORD, sc, fam, fl, None, base)
        del weights, w13, w2, layers
        torch.cuda.empty_cache()
    return rows


def _chord_humming_layers(group, weights, opts: BenchOptions, dev):
    """Chord's `humming` root layers (w13, w2, locks) of one weight group, loaded as vLLM 0.33 loads
    them (chord.lab.bench.vllm_sequence), for the chain timing."""
    import torch

    from chord.lab.bench import vllm_sequence as VS

    families = sorted({f for _, fams in group for f in fams})
    w13 = VS.build_layer("w13", weights.q13, weights.s13, gated=True, families=families, device=dev)
    w2 = VS.build_layer("w2", weights.q2, weights.s2, gated=False, families=families, device=dev)
    for fam in families:
        shapes = [sc.rows for sc, fams in group if fam in fams]
        w13.set_needed(fam, shapes)
        w2.set_needed(fam, shapes)
    locks = torch.zeros(torch.cuda.get_device_properties(dev).multi_processor_count * 8, dtype=torch.int32,
                        device=dev)
    return w13, w2, locks


def measure_chain(sc: Scenario, family: str, data, fi, layers, common: dict, opts: BenchOptions,
                  log: Callable[[str], None]) -> list[dict]:
    """The provider-owned chain through Chord's `humming` root (w13, SiLU and mul, w2; one CUDA-graph
    replay), as upstream's worker times it: rows rel_err_act and chain_us."""
    import torch

    from chord.lab.bench import vllm_sequence as VS

    w13, w2, locks = layers
    chain, check = VS.prepare_chain(family, sc, data, fi, w13, w2, locks, opts.humming_tuning_rows)
    chain()
    torch.cuda.synchronize()
    e_act = check()
    extra = {"check_act": "pass" if e_act <= I.TOLERANCE else "FAIL"}
    t = timing.bench(chain, warmup_ms=opts.warmup_ms, rep_ms=opts.rep_ms, graph=opts.cuda_graph)
    log(f"chord  {sc.id:20s} {family:18s} chain {t.p50:9.1f} us  (act err {e_act:.1e})")
    return [make_row(PROVIDER_CHORD, sc, family, "rel_err_act", e_act, e_act, e_act, "1", common, **extra),
            make_row(PROVIDER_CHORD, sc, family, "chain_us", t.p20, t.p50, t.p80, "us", common, timing=t.method,
                     **extra)]


# ---------------------------------------------------------------------------------------------
# Humming: live subprocess or the committed file


def humming_command(opts: BenchOptions, ids: str, families: str | None, json_out: Path) -> list[str]:
    """The upstream worker's command line for these options (chord.lab.bench.humming_baseline.command)."""
    return HB.command(opts.humming_dir, json_out, scenarios=ids, families=families, suite=opts.suite, seed=opts.seed,
                      warmup_ms=opts.warmup_ms, rep_ms=opts.rep_ms, check_rows=opts.check_rows, codes=opts.codes,
                      tuning_rows=opts.humming_tuning_rows, cuda_graph=opts.cuda_graph,
                      extra=["--chain"] if opts.chain else [])


def run_humming_subprocess(selected, opts: BenchOptions, out_dir: Path, log) -> tuple[list[dict], dict]:
    ids = ",".join(sc.id for sc, _ in selected)
    json_out = out_dir / "humming-raw.json"
    cmd = humming_command(opts, ids, opts.families, json_out)
    log("humming: " + " ".join(cmd))
    return HB.run_worker(cmd, HB.environment(opts.humming_dir), json_out, cwd=out_dir, log=log)


def committed_baseline_rows(selected, baseline_file: str | Path, common: dict) -> tuple[list[dict], dict]:
    """The committed file's Humming numbers for the selected scenarios, under PROVIDER_COMMITTED."""
    data = json.loads(Path(baseline_file).read_text())
    want = {(sc.id, f): sc for sc, fams in selected for f in fams}
    rows = []
    for r in data.get("results", []):
        sc = want.get((r["scenario"], r["family"]))
        if sc is None:
            continue
        extra = dict(common, block_m=r.get("block_m"), source=str(Path(baseline_file).name))
        extra["gpu"] = "NVIDIA H200 (committed file)"
        extra["timestamp"] = "2026-11-29"
        extra["commit"] = None
        t = r["sum_us"]
        rows.append(make_row(PROVIDER_COMMITTED, sc, r["family"], "time_us", None, t, None, "us", extra))
        rows.append(make_row(PROVIDER_COMMITTED, sc, r["family"], "floor_us", r["floor_us"], r["floor_us"],
                             r["floor_us"], "us", extra))
        rows.append(make_row(PROVIDER_COMMITTED, sc, r["family"], "pct_of_floor", None, r["pct_of_floor"], None,
                             "%", extra))
    meta = {"what": data.get("what"), "note": data.get("note"), "ceilings": data.get("ceilings"),
            "file": str(baseline_file)}
    return rows, meta


def add_humming_floors(hrows: list[dict], selected, ceilings, floors_by_key: dict) -> list[dict]:
    """Floor and %-of-floor rows for live Humming rows (same routing, same floors as Chord's)."""
    out = []
    by_key = {(sc.id, f): sc for sc, fams in selected for f in fams}
    for r in hrows:
        if r.get("metric") != "time_us":
            continue
        key = (r["scenario"], r["family"])
        sc = by_key.get(key)
        fl = floors_by_key.get(key)
        if sc is None or fl is None:
            continue
        common = {k: r.get(k) for k in ("gpu", "commit", "timestamp", "seed", "block_m", "check")}
        out += floor_rows(r["provider"], sc, r["family"], fl, r, common)
    return out


# ---------------------------------------------------------------------------------------------
# entry points


def run_gpu(opts: BenchOptions, out: TextIO | None = None) -> dict:
    out = out or sys.stdout
    import torch

    from chord.lab.bench import ceilings as C

    suite = load_suite(opts.suite)
    ids = opts.scenarios
    if ids is None and opts.quick:
        ids = ",".join(i for i in QUICK_SCENARIOS if i in suite.ids) or None
    selected = suite.select(ids, opts.families)
    if not selected:
        raise ValueError("no scenario left to run after --scenarios / --families")
    out_dir = Path(opts.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    common = {"gpu": gpu, "commit": git_commit(), "timestamp": now_utc(), "seed": opts.seed, "policy": _policy_name()}
    log = lambda msg: _print(out, msg)  # noqa: E731
    log(f"chord bench: {len(selected)} scenarios of suite {suite.name} on {gpu}, commit {common['commit']}")
    ceilings = C.measure()
    log(f"ceilings: copy {ceilings.copy_TB_per_s:.3f} TB/s, bf16 matmul {ceilings.bf16_matmul_TFLOP_per_s:.1f} TFLOP/s "
        f"({ceilings.source})")
    meta = {"suite": recorded_path(suite.path), "suite_name": suite.name, **common, "ceilings": ceilings.as_dict(),
            "torch": torch.__version__, "warmup_ms": opts.warmup_ms, "rep_ms": opts.rep_ms, "codes": opts.codes,
            "quick": opts.quick, "profile_file": opts.profile_file,
            "timing": "triton.testing.do_bench median (p20/p80), L2 flushed (256 MB) before every call"
                      + (", of a CUDA graph replay of the kernels" if opts.cuda_graph else ", eager calls"),
            "scenarios": [sc.id for sc, _ in selected]}
    rows = run_chord_gpu(selected, opts, ceilings, common, log)
    torch.cuda.empty_cache()

    floors_by_key = {}
    for sc, fams in selected:
        touched = I.describe_touched(I.make_topk_ids(sc, opts.seed), sc.experts)["experts_touched"]
        for f in fams:
            floors_by_key[(sc.id, f)] = F.scenario_floor(sc, ceilings, touched, f)
    if opts.humming_dir:
        hrows, hmeta = run_humming_subprocess(selected, opts, out_dir, log)
        for r in hrows:
            r.setdefault("commit", common["commit"])
            r.setdefault("timestamp", common["timestamp"])
        rows += hrows + add_humming_floors(hrows, selected, ceilings, floors_by_key)
        meta["humming"] = {"live": True, **hmeta}
    else:
        crows, cmeta = committed_baseline_rows(selected, opts.baseline_file, common)
        rows += crows
        meta["humming"] = {"live": False, **cmeta,
                           "message": "Humming was not run (no --humming-dir): the committed baseline file's "
                                      "numbers are shown, measured 2026-11-29 on another H200, not in this run"}
    result = {"meta": meta, "rows": rows}
    paths = report.write_all(result, out_dir)
    log("")
    log(report.terminal_table(result))
    if not meta["humming"]["live"]:
        log("\nHumming was NOT run in these runs (no --humming-dir): its column shows the committed baseline "
            f"file {Path(opts.baseline_file).name} (measured 2026-11-29), labelled '{PROVIDER_COMMITTED}'.")
    log("\n" + "\n".join(f"wrote {p}" for p in paths))
    return result


def dense_reference(x_rows, q, scales, experts):
    """Independent dense float32 ``x_rows[r] @ W[experts[r]]^T`` with every expert dequantized."""
    import torch

    w = q.float().unflatten(-1, (-1, 32)) * scales.float().unsqueeze(-1)
    w = w.flatten(-2)  # [E, N, K]
    return torch.einsum("rk,rnk->rn", x_rows.float(), w[experts.long()])


def run_cpu_fallback(opts: BenchOptions, out: TextIO | None = None) -> int:
    """No GPU: the float32 reference ops on scaled-down scenarios, checked against dense math."""
    out = out or sys.stdout
    import torch

    from chord import reference as R
    from chord import routing

    _print(out, "chord bench: no CUDA GPU found -- nothing is timed; running the float32 reference path "
                "on scaled-down EP8 decode/prefill scenarios instead.")
    t0 = time.time()
    table = []
    worst = 0.0
    for sc in cpu_scenarios():
        data = I.scenario_data(sc, opts.seed, "cpu")
        w = I.expert_weights(sc, opts.seed, "cpu", codes=opts.codes)
        routes = torch.arange(sc.rows)
        ex = I.route_experts(data.topk_ids, routes)
        dense_gu = dense_reference(data.x[routes // sc.top_k], w.q13, w.s13, ex)
        dense_dn = dense_reference(data.down_in, w.q2, w.s2, ex)
        for fam in sc.families:
            fi = I.family_inputs(fam, data)
            if fam == "indexed":
                r = routing.align_block_size(data.topk_ids, 8, sc.experts)
                gu = R.indexed_gemm_ref(fi.gate_up_in, w.q13, w.s13, r, sc.top_k)
                dn = R.indexed_gemm_ref(fi.down_in, w.q2, w.s2, r, 1)
            elif fam == "grouped_contiguous":
                gu = R.contiguous_gemm_ref(fi.gate_up_in, w.q13, w.s13, fi.expert_offsets)
                dn = R.contiguous_gemm_ref(fi.down_in, w.q2, w.s2, fi.expert_offsets)
            else:
                gu = R.masked_gemm_ref(fi.gate_up_in, w.q13, w.s13, fi.expert_num_tokens)
                dn = R.masked_gemm_ref(fi.down_in, w.q2, w.s2, fi.expert_num_tokens)
            rows_idx = I.rows_of_routes(fi, routes)
            e_gu = I.rel_err(gu.reshape(-1, gu.shape[-1])[rows_idx], dense_gu)
            e_dn = I.rel_err(dn.reshape(-1, dn.shape[-1])[rows_idx], dense_dn)
            pad = fi.row_route.reshape(-1) < 0
            pad_nan = bool(torch.isnan(gu.reshape(-1, gu.shape[-1])[pad]).all()) if bool(pad.any()) else True
            worst = max(worst, e_gu, e_dn)
            table.append({"scenario": sc.id, "family": fam, "M": sc.m, "rows": sc.rows, "experts": sc.experts,
                          "top_k": sc.top_k, "gate_up": f"{sc.n_gate_up}x{sc.k_gate_up}",
                          "down": f"{sc.n_down}x{sc.k_down}", "err_gate_up": e_gu, "err_down": e_dn,
                          "padding_untouched": pad_nan,
                          "check": "pass" if max(e_gu, e_dn) <= 1e-5 and pad_nan else "FAIL"})
    _print(out, report.cpu_table(table))
    _print(out, f"\nreference ops vs dense per-expert float32 math: worst relative error {worst:.1e} "
                f"({time.time() - t0:.1f}s). Run on a CUDA GPU for timings.")
    out_dir = Path(opts.out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "cpu-reference.json").write_text(json.dumps({"meta": {"gpu": None, "timestamp": now_utc(),
                                                                          "commit": git_commit()},
                                                                 "rows": table}, indent=1))
    except OSError as exc:
        _print(out, f"(could not write {out_dir}: {exc})")
    return 0 if all(r["check"] == "pass" for r in table) else 1


def main(opts: BenchOptions, out: TextIO | None = None) -> int:
    if not timing.cuda_available():
        return run_cpu_fallback(opts, out)
    result = run_gpu(opts, out)
    failed = [r for r in result["rows"] if r.get("provider") == PROVIDER_CHORD
              and (r.get("metric") == "error" or r.get("check") == "FAIL")]
    return 1 if failed else 0

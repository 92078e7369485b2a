"""The ``chord`` command line: ``chord bench``, ``chord tune``, ``chord info``, ``chord precompile``,
``chord profile``.

``chord bench`` runs a suite (see ``chord.bench.runner``); without a CUDA GPU it says so on its
first line and runs the float32 reference path on scaled-down scenarios instead (exit 0 when
the reference checks pass). ``chord info`` prints versions, the GPU, the compiler, the cache and
the profiles. ``chord precompile`` builds every kernel a profile can select. ``chord profile``
captures one scenario's calls with torch.profiler, Nsight Systems or Nsight Compute (chord.capture).
"""
from __future__ import annotations

import argparse
from pathlib import Path
import importlib.util
import os
import platform
import sys
from typing import Sequence


def _add_bench(sub) -> None:
    from chord.schedule import POLICY_RULES

    from chord.bench.suite import DEFAULT_SUITE, FAMILIES

    p = sub.add_parser("bench", help="time Chord's MoE GEMMs on a suite against the floors and against Humming",
                       description="Run a benchmark suite: check, time (do_bench median of gate_up + down), "
                                   "compare with floors and with upstream Humming.")
    p.add_argument("--suite", default=None, help=f"suite JSON (default: {DEFAULT_SUITE.name})")
    p.add_argument("--scenarios", default=None, help="comma-separated scenario ids (default: all)")
    p.add_argument("--families", default=None, help=f"comma-separated families of {', '.join(FAMILIES)}")
    p.add_argument("--humming-dir", default=os.environ.get("CHORD_HUMMING_DIR"),
                   help="install dir of upstream humming-kernels 0.1.20 (pip install --no-deps --target DIR "
                        "humming-kernels==0.1.20); runs the Humming baseline in a subprocess. Without it, the "
                        "committed baseline numbers are shown, labelled as such. Default $CHORD_HUMMING_DIR")
    p.add_argument("--out", default="bench-out", help="output dir for results.json, report.html, table.txt")
    p.add_argument("--quick", action="store_true",
                   help="shorter timing (warm-up 10 ms, rep 60 ms) and, without --scenarios, 4 representative "
                        "scenarios")
    p.add_argument("--seed", type=int, default=0, help="base seed of routing and data (0 = the suite's rule)")
    p.add_argument("--check-rows", type=int, default=512, help="routed rows checked against chord.reference")
    p.add_argument("--profile", default=None, help="Chord profile file (profiles/<name>.json; default $CHORD_PROFILE or h200)")
    p.add_argument("--codes", choices=("full", "sym7"), default="full",
                   help="INT4 code range of the random weights: full [-8,7] or sym7 [-7,7]")
    p.add_argument("--humming-tuning-rows", choices=("all", "matching"), default="all",
                   help="give Humming vLLM's whole tuning table (default) or only the row it selects "
                        "(same kernel, far less JIT time)")
    p.add_argument("--no-cuda-graph", action="store_true",
                   help="time eager calls instead of CUDA-graph replays (host/launch time then counts too)")
    p.add_argument("--policy", default=None,
                   help="selection policy: 'profile' (the tuned rules) or 'heuristic[,-rule...]' (no profile row; "
                        f"rules: {', '.join(POLICY_RULES)}). Default $CHORD_POLICY or profile")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from chord.bench import runner

    if args.check_rows < 1:
        print("chord bench: --check-rows must be >= 1", file=sys.stderr)
        return 2
    if args.policy is not None:
        from chord.schedule import parse_policy

        try:
            os.environ["CHORD_POLICY"] = parse_policy(args.policy).name  # every select() of the run sees it
        except ValueError as exc:
            print(f"chord bench: --policy: {exc}", file=sys.stderr)
            return 2
    opts = runner.BenchOptions(suite=args.suite, scenarios=args.scenarios, families=args.families,
                               humming_dir=args.humming_dir, out_dir=args.out, quick=args.quick, seed=args.seed,
                               check_rows=args.check_rows, profile_file=args.profile, codes=args.codes,
                               humming_tuning_rows=args.humming_tuning_rows, cuda_graph=not args.no_cuda_graph)
    try:
        return runner.main(opts)
    except ValueError as exc:
        print(f"chord bench: {exc}", file=sys.stderr)
        return 2


def _cmd_info(args: argparse.Namespace) -> int:
    import torch

    import chord

    def line(k: str, v) -> None:
        print(f"{k:22s} {v}")

    line("chord", f"{chord.__version__} ({os.path.dirname(chord.__file__)})")
    line("python", platform.python_version())
    line("torch", torch.__version__)
    for mod in ("triton", "plotly", "nvtx", "ipywidgets"):
        spec = importlib.util.find_spec(mod)
        if spec is None:
            line(mod, "not installed")
        else:
            try:
                line(mod, getattr(__import__(mod), "__version__", "installed"))
            except Exception as exc:  # a broken optional install must not break `chord info`
                line(mod, f"import failed: {type(exc).__name__}")
    spec = importlib.util.find_spec("humming")
    line("import humming ->", spec.origin if spec else "not found")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            line(f"cuda:{i}", f"{p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
                              f"{p.total_memory / 2**30:.0f} GiB")
    else:
        line("cuda", "no CUDA GPU visible (chord bench runs the CPU reference path)")
    try:
        from chord import jit

        try:
            nvcc = jit.nvcc_path()
            line("nvcc", f"{nvcc} ({jit.nvcc_version(nvcc)})")
        except Exception as exc:
            line("nvcc", str(exc))
        line("kernel cache", jit.cache_dir())
    except ImportError as exc:  # pragma: no cover
        line("chord.jit", f"unavailable: {exc}")
    try:
        from chord._resources import profiles_dir
        from chord.schedule import load_profile_file

        from chord.schedule import gpu_profile_name

        name = gpu_profile_name()
        pf = load_profile_file(name)
        line("profiles", f"{profiles_dir()} (in use: {name} = {pf.path}: {', '.join(sorted(pf.deployments))})")
        from chord import deployments as D

        line("role", f"{D.current_role()} (CHORD_ROLE: decode | prefill | both)")
        line("deployment", D.explicit_deployment() or "by weight shape (CHORD_DEPLOYMENT unset)")
        for d in D.describe(name):
            gemms = ", ".join(f"{n}x{k}" for n, k in d["gemms"]) or "any N, K"
            line(f"  {d['deployment']}", f"{'/'.join(d['experts'] and map(str, d['experts']))} experts, "
                                         f"GEMMs {gemms}, roles {', '.join(d['roles'])}")
    except Exception as exc:
        line("profiles", f"unavailable: {exc}")
    from chord.bench.suite import BASELINES_DIR, SUITES_DIR

    line("suites", ", ".join(sorted(p.name for p in SUITES_DIR.glob("*.json"))))
    line("baselines", ", ".join(sorted(p.name for p in BASELINES_DIR.glob("*.json"))))
    for k in sorted(k for k in os.environ if k.startswith("CHORD_")):
        line(k, os.environ[k])
    return 0


def _cmd_precompile(args: argparse.Namespace) -> int:
    from chord import jit

    results = jit.precompile_profile(args.profile, progress=not args.quiet)
    print(f"chord precompile: {len(results)} kernels of profile {args.profile} ready in {jit.cache_dir()}")
    if args.tune:
        from chord import tune

        suite, selected = tune_selection(args)
        scheds = tune.tune_schedules(suite=suite, scenario_ids=[sc.id for sc, _ in selected], families=args.families,
                                     profile_file=args.profile, max_candidates=args.max_candidates)
        results = jit.precompile(scheds, progress=not args.quiet)
        print(f"chord precompile: {len(results)} kernels `chord tune` would time ready in {jit.cache_dir()}")
    return 0


def _int_list(text: str, flag: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be a comma-separated list of positive ints, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise ValueError(f"{flag} must be a comma-separated list of positive ints, got {text!r}")
    return vals


SHAPE_FLAGS = ("experts", "n_gate_up", "k_gate_up", "n_down", "k_down")


def tune_selection(args: argparse.Namespace):
    """(suite, selection) `chord tune` / `chord precompile --tune` works on: the layer shape given
    by --experts/--n-gate-up/... with --tok-e or --tokens, or a suite's scenarios. Raises
    ValueError naming the flag for a bad combination, before any GPU work."""
    from chord.bench.suite import load_suite, shape_suite

    shape = [f for f in SHAPE_FLAGS if getattr(args, f, None) is not None]
    loads = [f for f in ("tok_e", "tokens") if getattr(args, f, None) is not None]
    if shape or loads:
        if len(shape) != len(SHAPE_FLAGS):
            missing = ", ".join("--" + f.replace("_", "-") for f in SHAPE_FLAGS if f not in shape)
            raise ValueError(f"a shape needs every one of --experts, --n-gate-up, --k-gate-up, --n-down, --k-down "
                             f"(missing {missing})")
        if len(loads) != 1:
            raise ValueError("a shape needs exactly one of --tok-e (rows per expert) or --tokens")
        if args.suite is not None or args.scenarios is not None:
            raise ValueError("give a shape (--experts ...) or --suite/--scenarios, not both")
        for f in SHAPE_FLAGS:
            if getattr(args, f) <= 0:
                raise ValueError(f"--{f.replace('_', '-')} must be positive, got {getattr(args, f)}")
        if not args.deployment:
            raise ValueError("a shape needs --deployment NAME (the name its profile entries get, e.g. EP16)")
        flag = "--tok-e" if loads[0] == "tok_e" else "--tokens"
        vals = _int_list(getattr(args, loads[0]), flag)
        suite = shape_suite(args.deployment, args.experts, args.n_gate_up, args.k_gate_up, args.n_down, args.k_down,
                            **{loads[0]: vals}, top_k=args.top_k, families=args.families)
        return suite, suite.select(None, None)
    if args.deployment:
        raise ValueError("--deployment names the entries of a shape given by --experts ...; a suite's scenarios "
                         "carry their own deployment")
    suite = load_suite(args.suite)
    return suite, suite.select(args.scenarios, args.families)


def _cmd_tune(args: argparse.Namespace) -> int:
    import time

    import torch

    from chord import tune

    if args.warmup_ms is None:
        args.warmup_ms = tune.WARMUP_MS
    try:
        tune._check_timing_args("chord tune", args.rep_ms, args.warmup_ms)
    except ValueError as exc:
        print(f"{exc} (--rep-ms / --warmup-ms)", file=sys.stderr)
        return 2
    try:  # the arguments, before any GPU work (an error inside the tuning keeps its traceback)
        suite, selected = tune_selection(args)
        if args.budget_minutes is not None and not args.budget_minutes > 0:
            raise ValueError(f"--budget-minutes must be positive, got {args.budget_minutes}")
        if args.max_candidates is not None and args.max_candidates < 1:
            raise ValueError(f"--max-candidates must be >= 1, got {args.max_candidates}")
    except (ValueError, OSError) as exc:
        print(f"chord tune: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("chord tune: no CUDA GPU here; tuning measures kernels on an sm_90 GPU, nothing to do.")
        return 2
    cache = None if args.no_timing_cache else tune.TimingCache()
    t0 = time.monotonic()
    points = tune.tune_suite(profile_file=args.profile, rep_ms=args.rep_ms, warmup_ms=args.warmup_ms,
                             suite=suite, scenario_ids=[sc.id for sc, _ in selected],
                             families=args.families, max_candidates=args.max_candidates,
                             budget_minutes=args.budget_minutes, timing_cache=cache, progress=not args.quiet)
    took = time.monotonic() - t0
    import shlex

    command = "chord " + " ".join(shlex.quote(a) for a in args.argv)
    meta = tune.entry_meta(selected)
    ppath, rpath = tune.write_tuning(points, Path(args.out), profile_file=args.profile, meta=meta,
                                     command=command.strip(), seconds=took)
    faster = sum(p.best_us < p.default_us for p in points)
    print(f"chord tune: {len(points)} GEMM points in {took / 60:.1f} min, {faster} faster than the current decision; "
          f"wrote {ppath} and {rpath}.\nUse it: export CHORD_PROFILE_DIR={Path(args.out).resolve()} "
          f"(or copy {ppath.name} into profiles/); entries {', '.join(sorted(meta))}")
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    from chord import capture

    try:
        cap = capture.capture(args.scenario, args.family, args.tool, args.out, iters=args.iters, suite=args.suite,
                              profile_file=args.profile, ncu_set=args.ncu_set, cuda_graph=args.cuda_graph)
    except capture.CaptureError as exc:
        print(f"chord profile: {exc}", file=sys.stderr)
        return 2
    if args.tool == "none":
        return 0
    print(f"chord profile: {cap.scenario} {cap.family}, {cap.iters} x (gate_up + down"
          f"{', one CUDA-graph replay each' if cap.cuda_graph else ''}), tool {cap.tool}")
    for r in cap.ranges:
        print(f"  {r['range']:58s} {r['calls']:4d} calls  {r['gpu_us_per_call']:10.1f} us GPU per call")
    for r in cap.kernels[:8]:
        print(f"  kernel {r['kernel'][:51]:51s} {r['calls']:4d} calls  {r['gpu_us_per_call']:10.1f} us per call")
    for name, path in cap.files.items():
        print(f"  wrote {name}: {path}")
    return 0


def _cmd_limits(args: argparse.Namespace) -> int:
    from chord import limits

    try:
        rows = limits.run(args.out, suite=args.suite, scenarios=args.scenarios, families=args.families,
                          profile_file=args.profile)
    except (limits.LimitsError, limits.CaptureError) as exc:
        print(f"chord limits: {exc}", file=sys.stderr)
        return 2
    print(limits.markdown(rows), end="")
    print(f"chord limits: {len(rows)} kernels; wrote {Path(args.out) / 'limits.json'} and {Path(args.out) / 'limits.md'}")
    return 0


def _add_shape_args(p) -> None:
    g = p.add_argument_group("a layer shape instead of a suite (chord tune for any shape)")
    g.add_argument("--experts", type=int, default=None, help="local experts of the layer")
    g.add_argument("--n-gate-up", type=int, default=None, help="gate_up output features (2 x intermediate)")
    g.add_argument("--k-gate-up", type=int, default=None, help="gate_up input features (hidden)")
    g.add_argument("--n-down", type=int, default=None, help="down output features (hidden)")
    g.add_argument("--k-down", type=int, default=None, help="down input features (intermediate)")
    g.add_argument("--tok-e", default=None, help="comma-separated rows per expert to tune at (EP layers)")
    g.add_argument("--tokens", default=None, help="comma-separated token counts to tune at (TP layers)")
    g.add_argument("--top-k", type=int, default=8, help="experts per token")
    g.add_argument("--deployment", default=None,
                   help="name of the deployment the tuned entries form (e.g. EP16): <name>-decode / <name>-prefill")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chord", description="Chord: W4A16 MoE GEMMs for Kimi K2.x on Hopper")
    sub = parser.add_subparsers(dest="command", metavar="{bench,tune,info,precompile,profile,limits}")
    sub.required = True
    _add_bench(sub)
    pi = sub.add_parser("info", help="versions, GPU, compiler, kernel cache, profiles")
    pi.set_defaults(func=_cmd_info)
    pp = sub.add_parser("precompile", help="build every kernel a profile can select (into the kernel cache)")
    pp.add_argument("--profile", default=None, help="profile file name (profiles/<name>.json; default $CHORD_PROFILE or h200)")
    pp.add_argument("--quiet", action="store_true", help="no progress bar")
    pp.add_argument("--tune", action="store_true", help="also build every candidate `chord tune` would time")
    pp.add_argument("--suite", default=None, help="with --tune: suite JSON (default: kimi_k2_h200.json)")
    pp.add_argument("--scenarios", default=None, help="with --tune: comma-separated scenario ids (default: all)")
    pp.add_argument("--families", default=None, help="with --tune: comma-separated families (default: the suite's)")
    _add_shape_args(pp)
    pp.add_argument("--max-candidates", type=int, default=24, help="with --tune: as chord tune's")
    pp.set_defaults(func=_cmd_precompile)
    pt = sub.add_parser("tune", help="time candidate schedules on a suite or any layer shape and write a tuned profile")
    pt.add_argument("--suite", default=None, help="suite JSON or packaged suite name (default: kimi_k2_h200)")
    pt.add_argument("--scenarios", default=None, help="comma-separated scenario ids (default: all)")
    pt.add_argument("--families", default=None, help="comma-separated families (default: the suite's)")
    _add_shape_args(pt)
    pt.add_argument("--max-candidates", type=int, default=24,
                    help="per GEMM, time the seeds and this many candidates in the cost model's order (chord.cost)")
    pt.add_argument("--budget-minutes", type=float, default=None,
                    help="spread this much timing over the GEMMs; each stops at its share (default: no limit)")
    pt.add_argument("--no-timing-cache", action="store_true",
                    help="time every candidate again (default: reuse <kernel cache>/tune-timings.json)")
    pt.add_argument("--quiet", action="store_true", help="no progress bar while the candidates compile")
    pt.add_argument("--profile", default=None,
                    help="profile file to start from (profiles/<name>.json; default $CHORD_PROFILE or h200)")
    pt.add_argument("--rep-ms", type=float, default=25.0, help="do_bench rep per candidate (ms)")
    pt.add_argument("--warmup-ms", type=float, default=None,
                    help="do_bench warm-up per candidate (ms, default chord.tune.WARMUP_MS = 100): long enough "
                         "for a compute-bound GEMM to reach the clock it sustains")
    pt.add_argument("--out", default="tune-out", help="output dir for <profile>.json and tuning.json")
    pt.set_defaults(func=_cmd_tune)
    from chord.bench.suite import FAMILIES
    from chord.capture import TOOLS

    pr = sub.add_parser("profile", help="capture an NVTX-annotated profile of one scenario's gate_up + down calls")
    pr.add_argument("--scenario", required=True, help="suite scenario id, e.g. ep8-prefill-tok128")
    pr.add_argument("--family", default="indexed", choices=FAMILIES)
    pr.add_argument("--tool", default="torch", choices=TOOLS,
                    help="torch: torch.profiler trace + summary; nsys / ncu: Nsight in a subprocess; none: just run")
    pr.add_argument("--iters", type=int, default=3, help="gate_up + down pairs captured after one warm-up pair")
    pr.add_argument("--cuda-graph", action="store_true",
                    help="capture the pair into one CUDA graph and profile its replays (as chord bench times it and "
                         "vLLM decodes): kernels and the gaps between them without host launches")
    pr.add_argument("--out", default="prof-out", help="output folder (trace.json / report.* and summary.json)")
    pr.add_argument("--suite", default=None, help="suite JSON (default: kimi_k2_h200.json)")
    pr.add_argument("--profile", default=None, help="profile file (default $CHORD_PROFILE or h200)")
    pr.add_argument("--ncu-set", default="basic", help="with --tool ncu: the section set (basic, full, ...)")
    pr.set_defaults(func=_cmd_profile)
    pl = sub.add_parser("limits", help="Nsight Compute counters per GEMM of the suite: what limits each kernel")
    pl.add_argument("--suite", default=None, help="suite JSON (default: kimi_k2_h200.json)")
    pl.add_argument("--scenarios", default=None, help="comma-separated scenario ids (default: all)")
    pl.add_argument("--families", default=None, help="comma-separated families (default: the suite's)")
    pl.add_argument("--profile", default=None, help="profile file (default $CHORD_PROFILE or h200)")
    pl.add_argument("--out", default="limits-out", help="output folder (limits.json, limits.md, raw.csv, report)")
    pl.set_defaults(func=_cmd_limits)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    if getattr(args, "profile", "") is None:
        from chord.schedule import gpu_profile_name

        args.profile = gpu_profile_name()
    from chord.jit import JitError

    try:
        return int(args.func(args) or 0)
    except (ValueError, JitError) as exc:  # bad profile, cache folder, nvcc, arguments: a message, no traceback
        print(f"chord {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The ``chord`` command line: ``chord bench``, ``chord tune``, ``chord info``, ``chord precompile``,
``chord capture``, ``chord limits``, ``chord stamps``, ``chord variant``, ``chord doctor`` (chord.lab.doctor).

Every flag and every CHORD_* environment value a command reads is checked (``chord.lab._args``)
before the command does anything, the same way on a machine with or without a GPU: a bad one
exits 2 with a message naming it and the valid choices.

``chord bench`` runs a suite (see ``chord.lab.bench.runner``); without a CUDA GPU it says so on its
first line and runs the float32 reference path on scaled-down scenarios instead (exit 0 when
the reference checks pass); ``--gemm`` times one GEMM under given schedules (chord.lab.bench.one_gemm),
``--host-time`` the host time of one call (chord.lab.bench.host_time), ``--layout-ablation`` the weight
layout against tile-major weights (chord.lab.bench.layout_ablation). ``chord info`` prints versions,
the GPU, the compiler, the cache and the profiles. ``chord precompile`` builds every kernel a
profile can select, and more on request, and packs them to carry (chord.lab.precompile). ``chord
capture`` captures one scenario's calls with torch.profiler, Nsight Systems or Nsight Compute
(chord.lab.capture); ``chord profile`` is its earlier name, kept for one release with a warning.
``chord variant`` writes a copy of a profile with knobs set on every rule (chord.lab.variant).
``chord distributed`` runs one MoE layer expert- or tensor-parallel over torch.distributed and
checks every rank against the float32 reference (chord.lab.distributed).
"""
from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
import importlib.util
import os
import platform
import sys
from typing import Sequence

from chord import _env
from chord.lab import _args


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's default, except where its help already says it or there is none to show."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False) or "default" in text.lower():
            return text
        return super()._get_help_string(action)


def _add_parser(sub, name: str, summary: str, description: str = ""):
    """A subcommand with its one-line summary (listed by ``chord --help``) and its description."""
    return sub.add_parser(name, help=summary, description=f"{summary[0].upper()}{summary[1:]}. {description}".strip(),
                          formatter_class=_Formatter)


def _add_selection(p, what: str = "") -> None:
    """--suite, --scenarios, --families (checked by _check_common)."""
    from chord.lab.bench.suite import DEFAULT_SUITE, FAMILIES

    p.add_argument("--suite", default=None,
                   help=f"{what}packaged suite name or suite JSON path (default: {DEFAULT_SUITE.stem})")
    p.add_argument("--scenarios", default=None, help=f"{what}comma-separated scenario ids of the suite (default: all)")
    p.add_argument("--families", default=None,
                   help=f"{what}comma-separated families of {', '.join(FAMILIES)} (default: each scenario's)")


def _add_profile(p, what: str = "profile file") -> None:
    p.add_argument("--profile", default=None,
                   help=f"{what}: a name in profiles/ (or $CHORD_PROFILE_DIR) or a .json path "
                        "(default: $CHORD_PROFILE, else h200)")


def _add_bench(sub) -> None:
    p = _add_parser(sub, "bench", "time Chord's MoE GEMMs on a suite against the floors and against Humming",
                    "Checks each call against the float32 reference, times gate_up + down (do_bench median), "
                    "compares with the floors and with upstream Humming 0.1.20. Without a CUDA GPU it says so and "
                    "runs the float32 reference path on scaled-down scenarios instead.")
    _add_selection(p)
    p.add_argument("--humming-dir", default=None,
                   help="install dir of upstream humming-kernels 0.1.20 (pip install --no-deps --target DIR "
                        "humming-kernels==0.1.20); runs the Humming baseline in a subprocess. Without it, the "
                        "committed baseline numbers are shown, labelled as such. Default $CHORD_HUMMING_DIR")
    p.add_argument("--out", default="bench-out", help="output dir for results.json, report.html, table.txt")
    p.add_argument("--quick", action="store_true",
                   help="shorter timing (warm-up 10 ms, rep 60 ms) and, without --scenarios, 4 representative "
                        "scenarios")
    p.add_argument("--seed", type=int, default=0, help="base seed of routing and data (0 = the suite's rule)")
    p.add_argument("--check-rows", type=int, default=512, help="routed rows checked against chord.reference")
    _add_profile(p)
    p.add_argument("--codes", choices=("full", "sym7"), default="full",
                   help="INT4 code range of the random weights: full [-8,7] or sym7 [-7,7]")
    p.add_argument("--humming-tuning-rows", choices=("all", "matching"), default="all",
                   help="give Humming vLLM's whole tuning table (all) or only the row it selects "
                        "(matching: same kernel, far less JIT time)")
    p.add_argument("--no-chain", action="store_true",
                   help="leave out the provider-owned chain (gate_up, SiLU and mul, down through each library's "
                        "humming root, one CUDA graph: metric chain_us), timed by default beside gate_up + down")
    p.add_argument("--no-cuda-graph", action="store_true",
                   help="time eager calls instead of CUDA-graph replays (host/launch time then counts too)")
    p.add_argument("--policy", default=None,
                   help="selection policy: 'profile' (the tuned rules), 'heuristic[,-rule...]' (no profile row) or "
                        "'batch_invariant'. Default $CHORD_POLICY, else profile")
    g = p.add_argument_group("one GEMM instead of the suite (for A/B timings and under ncu / nsys)")
    g.add_argument("--gemm", choices=GEMMS, default=None,
                   help="time this GEMM of the one scenario --scenarios names (and of the one family --families "
                        "names, default the scenario's first) under each --schedule; outputs compared bit for bit")
    g.add_argument("--schedule", action="append", default=None, metavar="ID",
                   help="with --gemm: a schedule id to time (repeatable; the first is the reference the others are "
                        "compared with; default: the schedule chord bench launches for that GEMM)")
    g.add_argument("--rep-ms", type=float, default=None,
                   help="with --gemm or --layout-ablation: do_bench rep per timing (ms; default 50 and 30)")
    g.add_argument("--warmup-ms", type=float, default=None,
                   help="with --gemm or --layout-ablation: do_bench warm-up per timing (ms; default "
                        "chord.lab.tune.WARMUP_MS = 100)")
    h = p.add_argument_group("host time of one call instead of the suite")
    h.add_argument("--host-time", action="store_true",
                   help="CPU time per call of the scenario's GEMMs (default scenario tp8-m1): Chord's humming_forward "
                        "(vLLM's path), chord.ops, the raw op, the driver launch alone; with --humming-dir also "
                        "upstream Humming's humming_forward in its own process")
    h.add_argument("--calls", type=int, default=None, help="with --host-time: timed calls per measurement (default 2000)")
    h.add_argument("--parts", action="store_true",
                   help="with --host-time: time the pieces of a raw call's Python side one by one")
    h.add_argument("--cprofile", action="store_true", help="with --host-time: the trusted chord.ops call under cProfile")
    la = p.add_argument_group("the weight layout's ablation instead of the suite")
    la.add_argument("--layout-ablation", action="store_true",
                    help="the layout's GEMMs (chord.lab.tune.LAYOUT_GEMMS) on tile-grouped (G = 8) and tile-major (G = 1) "
                         "weights; writes layout.json into --out, exits 1 if an output differs")
    la.add_argument("--repeats", type=int, default=None, help="with --layout-ablation: timings of each GEMM and G "
                                                                "(default 2)")
    p.set_defaults(func=_cmd_bench, check=_check_bench)


GEMMS = ("gate_up", "down")
#: the runs `chord bench` makes instead of the suite, and the flags that belong to each
BENCH_MODES = {"--gemm": ("gemm", ("--schedule", "--rep-ms", "--warmup-ms")),
               "--host-time": ("host_time", ("--calls", "--parts", "--cprofile")),
               "--layout-ablation": ("layout_ablation", ("--rep-ms", "--warmup-ms", "--repeats"))}
_MODE_FLAGS = {"--schedule": "schedule", "--rep-ms": "rep_ms", "--warmup-ms": "warmup_ms", "--calls": "calls",
               "--parts": "parts", "--cprofile": "cprofile", "--repeats": "repeats"}


def _bench_mode(args: argparse.Namespace) -> str | None:
    """The one of --gemm / --host-time / --layout-ablation given (None: the suite); a flag of
    another mode, or two modes, are refused by name."""
    given = [flag for flag, (dest, _) in BENCH_MODES.items() if getattr(args, dest)]
    if len(given) > 1:
        raise _args.UsageError(f"{' and '.join(given)} are different runs; give one of them")
    mode = given[0] if given else None
    allowed = BENCH_MODES[mode][1] if mode else ()
    for flag, dest in _MODE_FLAGS.items():
        if getattr(args, dest) not in (None, False) and flag not in allowed:
            owners = " or ".join(m for m, (_, flags) in BENCH_MODES.items() if flag in flags)
            raise _args.UsageError(f"{flag} applies with {owners} only")
    return mode


def _one_scenario(args: argparse.Namespace, mode: str, default: str | None = None):
    """(scenario, family) of a one-scenario run: --scenarios must name exactly one (or none for
    `default`), --families at most one that the scenario runs (default its first)."""
    from chord.lab.bench.suite import load_suite

    ids = _args.split_list(args.scenarios) or ([default] if default else [])
    if len(ids) != 1:
        raise _args.UsageError(f"{mode} runs one scenario: --scenarios must name exactly one, got "
                               f"{args.scenarios!r}")
    sc = load_suite(args.suite).scenario(ids[0])
    fams = _args.split_list(args.families) or [sc.families[0]]
    if len(fams) != 1:
        raise _args.UsageError(f"{mode} runs one family: --families must name one, got {args.families!r}")
    return sc, _args.check_choice(f"--families (scenario {sc.id} runs)", fams[0], sc.families)


def _check_bench_mode(args: argparse.Namespace, mode: str | None) -> None:
    """The flags of --gemm / --host-time / --layout-ablation, before any GPU work."""
    from chord.lab import tune

    if mode in ("--gemm", "--layout-ablation"):
        if args.humming_dir is not None:
            raise _args.UsageError(f"--humming-dir applies to the suite run and --host-time, not to {mode}")
        try:
            tune._check_timing_args(f"chord bench {mode}", 1.0 if args.rep_ms is None else args.rep_ms,
                                    tune.WARMUP_MS if args.warmup_ms is None else args.warmup_ms)
        except ValueError as exc:
            raise _args.UsageError(f"{exc} (--rep-ms / --warmup-ms)") from None
    if mode == "--gemm":
        from chord import ops

        sc, family = _one_scenario(args, mode)
        n, k, _ = sc.gemm_problem(family, args.gemm)
        for sid in args.schedule or ():
            try:  # the checks chord.ops makes at the launch: family, N and K fit
                ops._check_schedule("chord bench", sid, family, n, k)
            except ValueError as exc:
                raise _args.UsageError(f"--schedule {sid!r}: {exc}") from None
        args.one_scenario, args.one_family = sc.id, family
    elif mode == "--host-time":
        sc, family = _one_scenario(args, mode, default="tp8-m1")
        _args.check_choice("--families (--host-time times the indexed family)", family, ("indexed",))
        args.calls = _args.check_positive_int("--calls", 2000 if args.calls is None else args.calls)
        args.one_scenario = sc.id
    elif mode == "--layout-ablation":
        if args.scenarios is not None or args.families is not None or args.suite is not None:
            raise _args.UsageError("--layout-ablation times its own GEMMs (chord.lab.tune.LAYOUT_GEMMS): "
                                   "leave out --suite, --scenarios and --families")
        args.repeats = _args.check_positive_int("--repeats", 2 if args.repeats is None else args.repeats)


def _check_bench(args: argparse.Namespace) -> None:
    args.mode = _bench_mode(args)
    _args.check_positive_int("--check-rows", args.check_rows)
    _check_bench_mode(args, args.mode)
    if args.policy is not None:
        args.policy = _args.check_policy("--policy", args.policy)
    if args.humming_dir is None and _env.get("CHORD_HUMMING_DIR"):
        args.humming_dir = str(_args.check_humming_dir("environment variable CHORD_HUMMING_DIR",
                                                       _env.get("CHORD_HUMMING_DIR")))
    elif args.humming_dir is not None:
        args.humming_dir = str(_args.check_humming_dir("--humming-dir", args.humming_dir))


def _cmd_bench_mode(args: argparse.Namespace) -> int:
    """--gemm, --host-time, --layout-ablation: each needs an sm_90 GPU."""
    import torch

    if not torch.cuda.is_available():
        print(f"chord bench {args.mode}: no CUDA GPU here; it times kernels on an sm_90 GPU, nothing to do.")
        return 2
    if args.mode == "--gemm":
        from chord.lab.bench import one_gemm

        one_gemm.run(args.one_scenario, args.one_family, args.gemm, args.schedule or (), profile=args.profile,
                     rep_ms=50.0 if args.rep_ms is None else args.rep_ms, warmup_ms=args.warmup_ms, suite=args.suite,
                     out=lambda line: print(line, flush=True))
        return 0
    if args.mode == "--host-time":
        from chord.lab.bench import host_time

        with _env.override(CHORD_PROFILE=args.profile):  # Chord's humming root decides with the same file
            host_time.measure(args.one_scenario, calls=args.calls, profile=args.profile, humming_dir=args.humming_dir,
                              parts=args.parts, cprofile=args.cprofile, suite=args.suite,
                              out=lambda line: print(line, flush=True))
        return 0
    from chord.lab.bench import layout_ablation

    return layout_ablation.run(rep_ms=30.0 if args.rep_ms is None else args.rep_ms, repeats=args.repeats,
                               warmup_ms=args.warmup_ms, out_file=Path(args.out) / "layout.json",
                               out=lambda line: print(line, flush=True))


def _cmd_bench(args: argparse.Namespace) -> int:
    from chord.lab.bench import runner

    opts = runner.BenchOptions(suite=args.suite, scenarios=args.scenarios, families=args.families,
                               humming_dir=args.humming_dir, out_dir=args.out, quick=args.quick, seed=args.seed,
                               check_rows=args.check_rows, profile_file=args.profile, codes=args.codes,
                               humming_tuning_rows=args.humming_tuning_rows, cuda_graph=not args.no_cuda_graph,
                               chain=not args.no_chain)
    # --policy (checked by _check_bench): every select() of the run sees it
    policy = _env.override(CHORD_POLICY=args.policy) if args.policy is not None else contextlib.nullcontext()
    try:
        with policy:
            return _cmd_bench_mode(args) if args.mode else runner.main(opts)
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
    from chord.lab.bench.suite import BASELINES_DIR, SUITES_DIR

    line("suites", ", ".join(sorted(p.name for p in SUITES_DIR.glob("*.json"))))
    line("baselines", ", ".join(sorted(p.name for p in BASELINES_DIR.glob("*.json"))))
    for k, v in _env.current().items():
        line(k, v)
    try:
        _args.check_environment()
    except _args.UsageError as exc:
        line("environment", f"INVALID: {exc}")
        return 2
    line("environment", "ok (every CHORD_* value is valid)")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from chord.lab import doctor

    return doctor.main()


def _check_precompile(args: argparse.Namespace) -> None:
    """--tune's selection, --record files, --tests' checkout, --out, --cache-dir and --jobs, before
    anything is built."""
    from chord.lab import precompile

    if args.jobs is not None:
        _args.check_positive_int("--jobs", args.jobs)
    if args.cache_dir is not None:
        args.cache_dir = str(_args.check_out_dir("--cache-dir", args.cache_dir))
    if args.archive is not None:
        args.archive = str(_args.check_out_file("--out", args.archive, precompile.ARCHIVE_SUFFIX))
    if args.tests:
        why = precompile.checkout_missing()
        if why:
            raise _args.UsageError(f"--tests: {why}")
    records = [str(r) for r in args.record or ()]
    if args.tests and precompile.DEFAULT_RECORD.is_file() and str(precompile.DEFAULT_RECORD) not in records:
        records.append(str(precompile.DEFAULT_RECORD))
    for r in records:
        try:
            precompile.read_record(r)
        except OSError as exc:
            raise _args.UsageError(f"--record {r!r}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise _args.UsageError(f"--record: {exc}") from None
    args.records = records
    shape = [f for f in (*SHAPE_FLAGS, "tok_e", "tokens", "deployment") if getattr(args, f, None) is not None]
    chosen = [f"--{f.replace('_', '-')}" for f in ("suite", "scenarios", "families") if getattr(args, f) is not None]
    if not args.tune and (shape or chosen):
        flags = ", ".join(chosen + [f"--{f.replace('_', '-')}" for f in shape])
        raise _args.UsageError(f"{flags}: these choose what --tune builds; add --tune")
    args.tune_suite = args.tune_selected = None
    if args.tune:
        _args.check_positive_int("--max-candidates", args.max_candidates)
        try:  # the shape or the suite selection
            args.tune_suite, args.tune_selected = tune_selection(args)
        except ValueError as exc:
            raise _args.UsageError(str(exc)) from None


def _cmd_precompile(args: argparse.Namespace) -> int:
    # --cache-dir: chord.jit builds into it (an override every thread of the build sees)
    cache = _env.override(CHORD_CACHE_DIR=args.cache_dir) if args.cache_dir else contextlib.nullcontext()
    with cache:
        return _precompile(args)


def _precompile(args: argparse.Namespace) -> int:
    import time

    from chord import jit
    from chord.lab import precompile

    tuned = []
    if args.tune:
        from chord.lab import tune

        tuned = tune.tune_schedules(suite=args.tune_suite, scenario_ids=[sc.id for sc, _ in args.tune_selected],
                                    families=args.families, profile_file=args.profile,
                                    max_candidates=args.max_candidates)
    scheds = precompile.collect(args.profile, ablations=args.ablations, tests=args.tests, tune=tuned)
    extra = precompile.extra_kernels(args.records, scheds)
    if args.list:
        print("\n".join(precompile.listing(scheds, extra)))
        return 0
    t = time.monotonic()
    res = precompile.build(scheds, extra, jobs=args.jobs, progress=not args.quiet)
    spills = sum(1 for r in res if r.spill_bytes)
    serial = sum(1 for r in res if r.wgmma_serialized)
    what = ", ".join(w for w, on in (("its ablations, policies and notebook tables", args.ablations or args.tests),
                                      ("the GPU tests'", args.tests), (f"{len(args.records)} records", args.records),
                                      (f"{len(tuned)} chord tune candidates", args.tune)) if on)
    print(f"chord precompile: {len(res)} kernels of profile {args.profile}{' with ' + what if what else ''} ready in "
          f"{jit.cache_dir()} ({time.monotonic() - t:.0f} s, {spills} with register spills, {serial} with wgmmas serialized by ptxas)")
    if args.archive:
        n = precompile.pack([r.cubin for r in res], args.archive)
        size = Path(args.archive).stat().st_size / 2**20
        print(f"chord precompile: {n} cubins packed into {args.archive} ({size:.1f} MiB); on the GPU machine: "
              f"mkdir -p $CHORD_CACHE_DIR && tar -xf {Path(args.archive).name} -C $CHORD_CACHE_DIR")
    return 0


def _int_list(text: str, flag: str) -> list[int]:
    items = _args.split_list(text) or []
    try:
        vals = [int(v) for v in items]
    except ValueError:
        vals = []
    if not vals or any(v <= 0 for v in vals):
        raise ValueError(f"{flag} must be a comma-separated list of positive ints, got {text!r}")
    return vals


SHAPE_FLAGS = ("experts", "n_gate_up", "k_gate_up", "n_down", "k_down")


def _check_layer_shape(args: argparse.Namespace) -> None:
    """A gated MoE layer in the swap16g layout: gate_up [E, 2I, H] and down [E, H, I], N a multiple
    of 16 and K of 64 for both GEMMs (a typo is named here, before any GPU work)."""
    from chord.formats import _check_swap16_nk

    for n_flag, k_flag in (("n_gate_up", "k_gate_up"), ("n_down", "k_down")):
        _check_swap16_nk("chord tune", "--" + n_flag.replace("_", "-"), getattr(args, n_flag),
                         "--" + k_flag.replace("_", "-"), getattr(args, k_flag))
    if args.n_down != args.k_gate_up or 2 * args.k_down != args.n_gate_up:
        raise ValueError(f"a gated MoE layer has gate_up [E, 2I, H] and down [E, H, I]: --n-down must equal "
                         f"--k-gate-up (H) and --k-down half of --n-gate-up (I), got gate_up N={args.n_gate_up}, "
                         f"K={args.k_gate_up}, down N={args.n_down}, K={args.k_down}")


def tune_selection(args: argparse.Namespace):
    """(suite, selection) `chord tune` / `chord precompile --tune` works on: the layer shape given
    by --experts/--n-gate-up/... with --tok-e or --tokens, or a suite's scenarios. Raises
    ValueError naming the flag for a bad combination, before any GPU work."""
    from chord.lab.bench.suite import load_suite, shape_suite

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
        _check_layer_shape(args)
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


def _check_tune(args: argparse.Namespace) -> None:
    from chord.lab import tune

    if args.warmup_ms is None:
        args.warmup_ms = tune.WARMUP_MS
    try:
        tune._check_timing_args("chord tune", args.rep_ms, args.warmup_ms)
    except ValueError as exc:
        raise _args.UsageError(f"{exc} (--rep-ms / --warmup-ms)") from None
    try:  # the shape or the suite selection, before any GPU work
        args.tune_suite, args.tune_selected = tune_selection(args)
    except ValueError as exc:
        raise _args.UsageError(str(exc)) from None
    if args.budget_minutes is not None and not args.budget_minutes > 0:
        raise _args.UsageError(f"--budget-minutes must be positive, got {args.budget_minutes}")
    _args.check_positive_int("--max-candidates", args.max_candidates)


def _cmd_tune(args: argparse.Namespace) -> int:
    import shlex
    import time

    import torch

    from chord.lab import tune

    if not torch.cuda.is_available():
        print("chord tune: no CUDA GPU here; tuning measures kernels on an sm_90 GPU, nothing to do.")
        return 2
    suite, selected = args.tune_suite, args.tune_selected
    cache = None if args.no_timing_cache else tune.TimingCache()
    t0 = time.monotonic()
    points = tune.tune_suite(profile_file=args.profile, rep_ms=args.rep_ms, warmup_ms=args.warmup_ms,
                             suite=suite, scenario_ids=[sc.id for sc, _ in selected],
                             families=args.families, max_candidates=args.max_candidates,
                             budget_minutes=args.budget_minutes, timing_cache=cache, progress=not args.quiet)
    took = time.monotonic() - t0
    command = "chord " + " ".join(shlex.quote(a) for a in args.argv)
    meta = tune.entry_meta(selected)
    ppath, rpath = tune.write_tuning(points, Path(args.out), profile_file=args.profile, meta=meta,
                                     command=command.strip(), seconds=took)
    faster = sum(p.best_us < p.default_us for p in points)
    print(f"chord tune: {len(points)} GEMM points in {took / 60:.1f} min, {faster} faster than the current decision; "
          f"wrote {ppath} and {rpath}.\nUse it: export CHORD_PROFILE_DIR={Path(args.out).resolve()} "
          f"(or copy {ppath.name} into profiles/); entries {', '.join(sorted(meta))}")
    return 0


def _cmd_capture(args: argparse.Namespace) -> int:
    from chord.lab import capture

    try:
        cap = capture.capture(args.scenario, args.family, args.tool, args.out, iters=args.iters, suite=args.suite,
                              profile_file=args.profile, ncu_set=args.ncu_set, cuda_graph=args.cuda_graph)
    except capture.CaptureError as exc:
        print(f"chord capture: {exc}", file=sys.stderr)
        return 2
    if args.tool == "none":
        return 0
    print(f"chord capture: {cap.scenario} {cap.family}, {cap.iters} x (gate_up + down"
          f"{', one CUDA-graph replay each' if cap.cuda_graph else ''}), tool {cap.tool}")
    names = [r["range"] for r in cap.ranges] + [f"kernel {r['kernel']}" for r in cap.kernels[:8]]
    width = max((len(n) for n in names), default=0)  # names whole, never cut
    for r in cap.ranges:
        print(f"  {r['range']:{width}s} {r['calls']:4d} calls  {r['gpu_us_per_call']:10.1f} us GPU per call")
    for r in cap.kernels[:8]:
        print(f"  {'kernel ' + r['kernel']:{width}s} {r['calls']:4d} calls  {r['gpu_us_per_call']:10.1f} us per call")
    for name, path in cap.files.items():
        print(f"  wrote {name}: {path}")
    return 0


def _check_variant(args: argparse.Namespace) -> None:
    from chord.lab import variant

    try:
        args.sets = variant.parse_sets(args.set)
    except ValueError as exc:
        raise _args.UsageError(str(exc)) from None
    args.variant_out = str(_args.check_out_file("--out", args.variant_out, ".json"))


def _cmd_variant(args: argparse.Namespace) -> int:
    from chord.lab import variant

    n = variant.write(args.profile, args.sets, args.variant_out)
    print(f"chord variant: {n} schedules with {', '.join(args.set)} -> {args.variant_out}")
    return 0


def _check_distributed(args: argparse.Namespace) -> None:
    from chord.lab import distributed

    distributed.check_args(args)


def _cmd_distributed(args: argparse.Namespace) -> int:
    from chord.lab import distributed

    return distributed.command(args)


def _cmd_limits(args: argparse.Namespace) -> int:
    from chord.lab import limits

    try:
        rows = limits.run(args.out, suite=args.suite, scenarios=args.scenarios, families=args.families,
                          profile_file=args.profile)
    except (limits.LimitsError, limits.CaptureError) as exc:
        print(f"chord limits: {exc}", file=sys.stderr)
        return 2
    print(limits.markdown(rows), end="")
    print(f"chord limits: {len(rows)} kernels; wrote {Path(args.out) / 'limits.json'} and {Path(args.out) / 'limits.md'}")
    return 0


def _cmd_stamps(args: argparse.Namespace) -> int:
    from chord.lab import stamps

    try:
        rows = stamps.run(args.out, suite=args.suite, scenarios=args.scenarios, families=args.families,
                          reps=args.reps, profile_file=args.profile)
    except stamps.StampsError as exc:
        print(f"chord stamps: {exc}", file=sys.stderr)
        return 2
    print(stamps.markdown(rows), end="")
    print(f"chord stamps: {len(rows)} points; wrote {Path(args.out) / 'stamps.json'}, {Path(args.out) / 'stamps.md'} "
          f"and {Path(args.out) / 'ctas.csv'}")
    return 0


def _check_stamps(args: argparse.Namespace) -> None:
    if args.reps < 1:
        raise _args.UsageError(f"--reps must be >= 1, got {args.reps}")


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


def _check_capture(args: argparse.Namespace) -> None:
    suite = _args.check_suite("--suite", args.suite)
    _args.check_choice("--scenario", args.scenario, suite.ids)
    _args.check_choice(f"--family (scenario {args.scenario} runs)", args.family, suite.scenario(args.scenario).families)
    _args.check_positive_int("--iters", args.iters)


def _check_common(args: argparse.Namespace) -> None:
    """The environment, then the flags most commands share: --profile (else $CHORD_PROFILE),
    --suite / --scenarios / --families and --out; then the command's own check."""
    _args.check_environment()
    if hasattr(args, "profile"):
        if args.profile is None:
            from chord.schedule import gpu_profile_name

            args.profile = gpu_profile_name()  # checked with the environment
        else:
            _args.check_profile("--profile", args.profile)
    if hasattr(args, "scenarios"):
        _args.check_selection(_args.check_suite("--suite", args.suite), args.scenarios, args.families)
    if hasattr(args, "out"):
        _args.check_out_dir("--out", args.out)
    check = getattr(args, "check", None)
    if check is not None:
        check(args)


def build_parser() -> argparse.ArgumentParser:
    import chord
    from chord.lab.bench.suite import FAMILIES
    from chord.lab.capture import TOOLS

    parser = argparse.ArgumentParser(prog="chord", description="Chord: W4A16 MoE GEMMs for Kimi K2.x on Hopper",
                                     formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"chord {chord.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    sub.required = True
    _add_bench(sub)
    pi = _add_parser(sub, "info", "print versions, the GPU, the compiler, the kernel cache and the profiles",
                     "Reports; runs nothing. Exits 2 when a CHORD_* environment value is invalid.")
    pi.set_defaults(func=_cmd_info)
    pd = _add_parser(sub, "doctor", "check that this installation can serve: GPU, nvcc, kernel cache, profile, a "
                                    "forward through the humming root",
                     "One PASS / FAIL / SKIP line per check; exits 1 when a check fails. Without a GPU the forward "
                     "runs on the float32 reference path and the kernel checks say SKIP.")
    pd.set_defaults(func=_cmd_doctor)
    pp = _add_parser(sub, "precompile", "build every kernel a profile can select into the kernel cache, and more "
                                        "on request; pack them to carry",
                     "Needs nvcc, not a GPU: build here, carry the cache ($CHORD_CACHE_DIR, or the --out archive) to "
                     "the GPU machine.")
    _add_profile(pp)
    pp.add_argument("--quiet", action="store_true", help="no progress bar")
    pp.add_argument("--ablations", action="store_true",
                    help="also each profile rule fitted to the suite's and the GPU tests' N with its optimizations "
                         "switched off one by one, every packaged suite's decisions under every policy, and the "
                         "schedules of the notebooks' recorded tables")
    pp.add_argument("--tests", action="store_true",
                    help="--ablations and the GPU tests' schedules (fuzz pools, sanitizer cases, ids in tests/gpu and "
                         "tools, the committed tools/device_kernels.txt): needs a source checkout")
    pp.add_argument("--record", action="append", default=None, metavar="FILE",
                    help="also every kernel of a CHORD_RECORD_KERNELS file a GPU run wrote (repeatable)")
    pp.add_argument("--out", dest="archive", default=None, metavar="ARCHIVE",
                    help="pack the kernels' cubins (with their build logs and digests) into this .tar.xz to carry")
    pp.add_argument("--list", action="store_true", help="print the schedule ids and build nothing")
    pp.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (default: the CPU count)")
    pp.add_argument("--cache-dir", default=None, help="kernel cache to build into (default $CHORD_CACHE_DIR)")
    pp.add_argument("--tune", action="store_true", help="also build every candidate `chord tune` would time")
    _add_selection(pp, "with --tune: ")
    _add_shape_args(pp)
    pp.add_argument("--max-candidates", type=int, default=24, help="with --tune: as chord tune's")
    pp.set_defaults(func=_cmd_precompile, check=_check_precompile)
    pt = _add_parser(sub, "tune", "time candidate schedules on a suite or any layer shape and write a tuned profile",
                     "For each GEMM the current decision is checked against the float32 reference, then the seeds "
                     "and the cost model's first candidates are checked against it and timed (CUDA-graph do_bench "
                     "median); the fastest per GEMM becomes a rule of a named deployment (docs/serving.md). Needs "
                     "an sm_90 GPU.")
    _add_selection(pt)
    _add_shape_args(pt)
    pt.add_argument("--max-candidates", type=int, default=24,
                    help="per GEMM, time the seeds and this many candidates in the cost model's order (chord.cost)")
    pt.add_argument("--budget-minutes", type=float, default=None,
                    help="spread this much timing over the GEMMs; each stops at its share (default: no limit)")
    pt.add_argument("--no-timing-cache", action="store_true",
                    help="time every candidate again (default: reuse <kernel cache>/tune-timings.json)")
    pt.add_argument("--quiet", action="store_true", help="no progress bar while the candidates compile")
    _add_profile(pt, "profile to start from")
    pt.add_argument("--rep-ms", type=float, default=25.0, help="do_bench rep per candidate (ms)")
    pt.add_argument("--warmup-ms", type=float, default=None,
                    help="do_bench warm-up per candidate (ms, default chord.lab.tune.WARMUP_MS = 100): long enough "
                         "for a compute-bound GEMM to reach the clock it sustains")
    pt.add_argument("--out", default="tune-out", help="output dir for <profile>.json and tuning.json")
    pt.set_defaults(func=_cmd_tune, check=_check_tune)
    pr = _add_parser(sub, "capture", "capture an NVTX-annotated profile of one scenario's gate_up + down calls",
                     "torch.profiler, Nsight Systems or Nsight Compute over the bench's inputs, routing and "
                     "schedules. Needs an sm_90 GPU. (`chord profile` is this command's earlier name.)")
    pr.add_argument("--scenario", required=True, help="suite scenario id, e.g. ep8-prefill-tok128")
    pr.add_argument("--family", default="indexed", choices=FAMILIES, help="kernel family")
    pr.add_argument("--tool", default="torch", choices=TOOLS,
                    help="torch: torch.profiler trace + summary; nsys / ncu: Nsight in a subprocess; none: just run")
    pr.add_argument("--iters", type=int, default=3, help="gate_up + down pairs captured after one warm-up pair")
    pr.add_argument("--cuda-graph", action="store_true",
                    help="capture the pair into one CUDA graph and profile its replays (as chord bench times it and "
                         "vLLM decodes): kernels and the gaps between them without host launches")
    pr.add_argument("--out", default="prof-out", help="output folder (trace.json / report.* and summary.json)")
    pr.add_argument("--suite", default=None, help="packaged suite name or suite JSON path (default: kimi_k2_h200)")
    _add_profile(pr)
    pr.add_argument("--ncu-set", default="basic", help="with --tool ncu: the section set (basic, full, ...)")
    pr.set_defaults(func=_cmd_capture, check=_check_capture)
    pl = _add_parser(sub, "limits", "read Nsight Compute counters per GEMM of the suite: what limits each kernel",
                     "Duration, clock, DRAM and L2 bytes, issue and tensor-pipe use, occupancy, stalls and a "
                     "one-word limiter per kernel. Needs an sm_90 GPU and Nsight Compute.")
    _add_selection(pl)
    _add_profile(pl)
    pl.add_argument("--out", default="limits-out", help="output folder (limits.json, limits.md, raw.csv, report)")
    pl.set_defaults(func=_cmd_limits)
    ps = _add_parser(sub, "stamps", "time stamps per CTA of each GEMM of the suite: launch, ramp, streaming, tail",
                     "Runs stamped builds of the scenario's gate_up and down (every CTA records its SM and the "
                     "times of its entry, rows, first K block, epilogue, fix-up and exit) as one CUDA graph between "
                     "two timer kernels, L2 flushed before each replay, and reduces them per kernel. Checks the "
                     "stamped outputs against the plain kernels' bit for bit. Needs an sm_90 GPU.")
    _add_selection(ps)
    _add_profile(ps)
    ps.add_argument("--reps", type=int, default=20, help="graph replays (each one cold in L2)")
    ps.add_argument("--out", default="stamps-out", help="output folder (stamps.json, stamps.md, ctas.csv)")
    ps.set_defaults(func=_cmd_stamps, check=_check_stamps)
    pv = _add_parser(sub, "variant", "write a copy of a profile with knobs set on every rule they apply to",
                     "The 'knob on everywhere' side of an A/B that chord tune cannot time (it times one GEMM alone), "
                     "such as pdl=1, whose gain is between a layer's calls: bench or precompile with --profile FILE "
                     "then. Each value is checked against the knob table and the file is loaded back. Needs no GPU.")
    _add_profile(pv, "profile to start from")
    pv.add_argument("--set", action="append", required=True, metavar="KNOB=VALUE",
                    help="a knob value for every rule it applies to (repeatable)")
    pv.add_argument("--out", dest="variant_out", required=True, metavar="FILE", help="the .json file to write")
    pv.set_defaults(func=_cmd_variant, check=_check_variant)
    pdist = _add_parser(sub, "distributed", "run one MoE layer expert- or tensor-parallel over torch.distributed "
                                            "and check every rank against the float32 reference",
                        "Spawns --world-size processes (or runs as one rank under torchrun): NCCL with one GPU per "
                        "rank, or gloo on the CPU with the float32 reference behind the humming root. Times "
                        "dispatch, GEMMs and combine per rank; exits 1 when a rank's output misses the tolerance.")
    from chord.lab import distributed

    distributed.add_arguments(pdist)
    pdist.set_defaults(func=_cmd_distributed, check=_check_distributed)
    return parser


#: the subcommands, as `chord --help` lists them
COMMANDS = ("bench", "tune", "info", "doctor", "precompile", "capture", "limits", "stamps", "variant", "distributed")
#: earlier names of subcommands, accepted for one release with a warning: {old: new}
DEPRECATED_COMMANDS = {"profile": "capture"}


def _renamed(argv: list[str]) -> list[str]:
    """`argv` with a deprecated subcommand name replaced by its new name (said on stderr)."""
    for i, word in enumerate(argv):
        if word.startswith("-"):
            continue
        if word in DEPRECATED_COMMANDS:
            new = DEPRECATED_COMMANDS[word]
            print(f"chord: warning: `chord {word}` is deprecated and will be removed in the next release; it runs "
                  f"`chord {new}` (same flags), use that instead", file=sys.stderr)
            return [*argv[:i], new, *argv[i + 1:]]
        break
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    argv = _renamed(list(argv) if argv is not None else sys.argv[1:])
    args = build_parser().parse_args(argv)
    args.argv = argv
    from chord.jit import JitError

    try:
        if args.command not in ("info", "doctor"):  # these two report bad values instead of refusing them
            _check_common(args)
        return int(args.func(args) or 0)
    except (ValueError, JitError) as exc:  # bad flags, environment, profile, cache folder, nvcc: a message, exit 2
        print(f"chord {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

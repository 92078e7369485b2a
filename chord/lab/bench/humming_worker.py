"""Upstream Humming (humming-kernels 0.1.20) timed on a Chord suite: the child process.

Run it as its own process, with the upstream install dir first on the path (``chord bench
--humming-dir DIR`` does, through :mod:`chord.lab.bench.humming_baseline`)::

    pip install --no-deps --target /tmp/humming humming-kernels==0.1.20
    PYTHONPATH=/tmp/humming:$PWD python -P -m chord.lab.bench.humming_worker \\
        --humming-dir /tmp/humming --scenarios ep8-decode-tok1,tp8-m1 --json-out humming.json

Chord ships its own ``humming`` package (the vLLM-facing root) under the same import name, so
this module puts ``--humming-dir`` first on ``sys.path`` itself, imports ``humming`` before
anything else, and refuses to run (exit status 3) unless ``humming.__file__`` lies inside that
dir and its version is 0.1.20. It never imports Chord's root or kernels: only
``chord.routing`` / ``chord.formats`` (plain torch) through ``chord.lab.bench.inputs``, so the
routing and data of a scenario are the same as in Chord's run for the same ``--seed``. The
layers are built and called by :mod:`chord.lab.bench.vllm_sequence` (what vLLM 0.33 does, in order).
This is the only module of Chord that imports upstream ``humming``, and only in this process.

Checks and timing: outputs poisoned with NaN, one forward, relative Frobenius error of both
GEMMs against the float32 reference on a sample of routes; then ``do_bench`` (warm-up 50 ms,
rep 300 ms) of w13 + w2 together, and of each alone, each captured once into a CUDA graph and
timed as graph replays (kernels only; ``--no-cuda-graph`` times eager calls, where Humming's
~25-50 us of host time per ``humming_forward`` on the test machine would be measured instead of
its kernels at TP8 / 1 token).

``--tuning-rows matching`` (default ``all``) passes, instead of the whole table, only the rows
that vLLM's launcher would pick for the selected scenarios' ``valid_shape_m`` (widened to cover
every M): the same kernels and launches, but Humming's JIT (whose first call compiles every row
of the table it is given) compiles only those. Use it only to save compile time.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

from chord.lab.bench import vllm_sequence as VS
from chord.lab.bench.humming_baseline import EXIT_WRONG_HUMMING, PROVIDER, UPSTREAM_VERSION


class WrongHumming(RuntimeError):
    """``import humming`` does not give upstream humming-kernels from ``--humming-dir``."""


# ---------------------------------------------------------------------------------------------
# arguments and the upstream import


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from chord import _env

    p = argparse.ArgumentParser(
        prog="python -m chord.lab.bench.humming_worker",
        description="Time upstream humming-kernels 0.1.20 on a Chord suite, driven as vLLM 0.33 drives it.")
    p.add_argument("--humming-dir", default=_env.get("CHORD_HUMMING_DIR"),
                   help="install dir of upstream humming-kernels (pip install --no-deps --target DIR "
                        "humming-kernels==0.1.20); default $CHORD_HUMMING_DIR")
    p.add_argument("--suite", default=None, help="suite JSON (default: the packaged kimi_k2_h200 suite)")
    p.add_argument("--scenarios", default=None, help="comma-separated scenario ids (default: all)")
    p.add_argument("--families", default=None, help="comma-separated families (default: each scenario's)")
    p.add_argument("--seed", type=int, default=0, help="base seed of routing and data (same as chord bench)")
    p.add_argument("--json-out", required=True, help="where to write the result rows (JSON)")
    p.add_argument("--warmup-ms", type=float, default=50.0)
    p.add_argument("--rep-ms", type=float, default=300.0)
    p.add_argument("--check-rows", type=int, default=512, help="routes checked against the float32 reference")
    p.add_argument("--codes", choices=("full", "sym7"), default="full",
                   help="INT4 code range of the random weights: full [-8,7] (default) or sym7 [-7,7]")
    p.add_argument("--tuning-rows", choices=("all", "matching"), default="all",
                   help="pass vLLM's whole tuning table (default) or only the row it selects")
    p.add_argument("--no-split", action="store_true", help="time only w13+w2, not each GEMM alone")
    p.add_argument("--no-cuda-graph", action="store_true",
                   help="time eager calls instead of a CUDA-graph replay (host time then counts)")
    p.add_argument("--also-eager", action="store_true", help="also record eager w13+w2 time (metric time_us_eager)")
    p.add_argument("--chain", action="store_true",
                   help="also time the provider-owned chain w13, SiLU and mul (may_process_input), w2 as one graph "
                        "(metric chain_us; the activation checked against torch: rel_err_act)")
    p.add_argument("--host-time", action="store_true",
                   help="also record the host time of one humming_forward call (metrics host_us_gate_up / host_us_down: "
                        "the median as p50, the 90th percentile as p90)")
    p.add_argument("--host-calls", type=int, default=2000, help="with --host-time: timed calls per GEMM (>= 1)")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # tests drive the flow on the CPU
    p.add_argument("--allow-version-mismatch", action="store_true",
                   help=f"run even if the upstream package is not {UPSTREAM_VERSION} (rows say which version)")
    a = p.parse_args(argv)
    if not a.humming_dir:
        p.error("--humming-dir is required (or set CHORD_HUMMING_DIR)")
    if a.check_rows < 1:
        p.error("--check-rows must be >= 1")
    if a.host_calls < 1:
        p.error("--host-calls must be >= 1")
    if a.warmup_ms <= 0 or a.rep_ms <= 0:
        p.error("--warmup-ms and --rep-ms must be positive")
    return a


def import_upstream_humming(humming_dir: str | os.PathLike, *, expected_version: str = UPSTREAM_VERSION,
                            allow_version_mismatch: bool = False):
    """Import ``humming`` from ``humming_dir`` and prove it is upstream humming-kernels.

    Raises ``WrongHumming`` if the dir holds no ``humming`` package, if another ``humming``
    (e.g. Chord's shim) is already imported or wins on ``sys.path``, or on a version mismatch.
    """
    d = Path(humming_dir).expanduser().resolve()
    if not (d / "humming" / "__init__.py").is_file():
        raise WrongHumming(f"{d} holds no 'humming' package; install upstream with "
                           f"'pip install --no-deps --target {d} humming-kernels=={expected_version}'")
    if "humming" not in sys.modules:
        sys.path[:] = [str(d)] + [x for x in sys.path if Path(x or ".").resolve() != d]
    import humming  # noqa: PLC0415

    where = Path(getattr(humming, "__file__", "") or "").resolve()
    if d not in where.parents:
        raise WrongHumming(f"'import humming' resolves to {where}, not to the upstream install in {d} "
                           "(Chord's own humming shim or another install came first on sys.path)")
    version = str(getattr(humming, "__version__", "unknown"))
    if version != expected_version and not allow_version_mismatch:
        raise WrongHumming(f"upstream humming in {d} is version {version}, expected {expected_version} "
                           "(the version vLLM 0.33 pins); pass --allow-version-mismatch to run anyway")
    if not hasattr(humming, "ops"):
        raise WrongHumming(f"{where} does not look like humming-kernels (no humming.ops)")
    return humming


def assert_still_upstream(humming_dir: str | os.PathLike) -> None:
    d = Path(humming_dir).expanduser().resolve()
    mod = sys.modules.get("humming")
    where = Path(getattr(mod, "__file__", "") or "").resolve()
    if mod is None or d not in where.parents:
        raise WrongHumming(f"sys.modules['humming'] changed to {where} during the run")


# ---------------------------------------------------------------------------------------------
# driver


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _log(msg: str) -> None:
    print(f"[humming-baseline {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _row(sc, family: str, metric: str, p20, p50, p80, unit: str, common: dict, **extra) -> dict:
    r = {"provider": PROVIDER, "scenario": sc.id, "family": family, "metric": metric,
         "p20": p20, "p50": p50, "p80": p80, "unit": unit, **common}
    r.update(extra)
    return r


def run(args: argparse.Namespace) -> dict:
    humming = import_upstream_humming(args.humming_dir, allow_version_mismatch=args.allow_version_mismatch)
    import torch

    from chord.lab.bench import inputs as I
    from chord.lab.bench import timing
    from chord.lab.bench.suite import load_suite, recorded_path, scenarios_by_weights

    dev = torch.device(args.device)
    on_gpu = dev.type == "cuda"
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("humming_worker needs a CUDA GPU")
    suite = load_suite(args.suite)
    selected = suite.select(args.scenarios, args.families)
    gpu = torch.cuda.get_device_name(dev) if on_gpu else str(dev)
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count if on_gpu else 132

    def sync():
        if on_gpu:
            torch.cuda.synchronize()
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:  # pragma: no cover
        triton_version = None
    meta = {
        "provider": PROVIDER, "humming_file": recorded_path(humming.__file__, args.humming_dir),
        "humming_version": str(getattr(humming, "__version__", "unknown")), "torch": torch.__version__,
        "triton": triton_version, "gpu": gpu, "num_sms": num_sms, "python": platform.python_version(),
        "suite": recorded_path(suite.path), "seed": args.seed, "codes": args.codes, "tuning_rows": args.tuning_rows,
        "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms, "started": _now(),
        "how": "compressed-tensors pack-quantized -> humming schema -> prepare_and_transform_humming_tensors "
               "(N pad 256, K pad 128) -> get_heuristics_config tables; valid_shape_m = M*top_k; "
               "moe_align block = block_shape[0] of the w13 row; humming_forward w13 then w2",
    }
    out = {"meta": meta, "rows": []}
    out_path = Path(args.json_out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def flush():
        out_path.write_text(json.dumps(out, indent=1, default=str))

    locks = torch.zeros(num_sms * 8, dtype=torch.int32, device=dev)
    common = {"gpu": gpu, "seed": args.seed}
    flush()
    for group in scenarios_by_weights(selected):
        sc0 = group[0][0]
        families = sorted({f for _, fams in group for f in fams})
        t0 = time.time()
        weights = I.expert_weights(sc0, args.seed, dev, codes=args.codes)
        w13 = VS.build_layer("w13", weights.q13, weights.s13, gated=True, families=families, device=dev)
        w2 = VS.build_layer("w2", weights.q2, weights.s2, gated=False, families=families, device=dev)
        assert_still_upstream(args.humming_dir)
        for fam in families:
            shapes = [sc.rows for sc, fams in group if fam in fams]
            w13.set_needed(fam, shapes)
            w2.set_needed(fam, shapes)
        meta.setdefault("layers", {})[sc0.deployment] = {
            "w13": {"config": json.loads(w13.config.to_str()), "b_dtype": w13.b_dtype,
                    "table_rows": {f: len(t) for f, t in w13.tables.items()}},
            "w2": {"config": json.loads(w2.config.to_str()), "b_dtype": w2.b_dtype,
                   "table_rows": {f: len(t) for f, t in w2.tables.items()}},
            "build_s": round(time.time() - t0, 2)}
        _log(f"{sc0.deployment}: weights built and converted in {time.time() - t0:.1f}s "
             f"(b_dtype {w13.b_dtype}; table rows {meta['layers'][sc0.deployment]['w13']['table_rows']})")
        flush()
        for sc, fams in group:
            data = I.scenario_data(sc, args.seed, dev)
            touched = I.describe_touched(data.topk_ids, sc.experts)
            for fam in fams:
                base = dict(common, M=sc.m, rows=sc.rows, deployment=sc.deployment, tok_e=sc.tok_e,
                            rows_per_expert=sc.rows_per_expert,
                            b_dtype=w13.b_dtype, tuning_rows=args.tuning_rows, **touched)
                try:
                    t1 = time.time()
                    fi = I.family_inputs(fam, data)
                    gate_up, down, gu_out, dn_out, info = VS.prepare_calls(fam, sc, data, fi, w13, w2, locks,
                                                                        args.tuning_rows)
                    base.update(block_m=info.get("block_m"), max_rows=info.get("max_rows"),
                                humming_row_gate_up=info["humming_row_gate_up"],
                                humming_row_down=info["humming_row_down"])
                    I.poison_(gu_out)
                    I.poison_(dn_out)
                    gate_up()
                    down()
                    sync()
                    first_s = time.time() - t1
                    routes = I.sample_routes(sc.rows, args.check_rows, data.seed, dev)
                    e_gu, e_dn = I.check_family_outputs(fi, data, weights, gu_out, dn_out, routes)
                    ok = e_gu <= I.TOLERANCE and e_dn <= I.TOLERANCE
                    base["check"] = "pass" if ok else "FAIL"
                    out["rows"].append(_row(sc, fam, "rel_err_gate_up", e_gu, e_gu, e_gu, "1", base))
                    out["rows"].append(_row(sc, fam, "rel_err_down", e_dn, e_dn, e_dn, "1", base))

                    def both():
                        gate_up()
                        down()

                    graph = not args.no_cuda_graph
                    t = timing.bench(both, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, graph=graph)
                    out["rows"].append(_row(sc, fam, "time_us", t.p20, t.p50, t.p80, "us", base, timing=t.method))
                    msg = f"{sc.id:20s} {fam:18s} {t.p50:9.1f} us  err {e_gu:.1e}/{e_dn:.1e}"
                    if not args.no_split:
                        for name, fn in (("gate_up_us", gate_up), ("down_us", down)):
                            ts = timing.bench(fn, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, graph=graph)
                            out["rows"].append(_row(sc, fam, name, ts.p20, ts.p50, ts.p80, "us", base,
                                                    timing=ts.method))
                            msg += f"  {name[:-3]} {ts.p50:.1f}"
                    if args.chain:  # the provider-owned chain: gate_up, SiLU and mul, down (one graph)
                        chain, check = VS.prepare_chain(fam, sc, data, fi, w13, w2, locks, args.tuning_rows)
                        chain()
                        sync()
                        e_act = check()
                        out["rows"].append(_row(sc, fam, "rel_err_act", e_act, e_act, e_act, "1", base))
                        tc = timing.bench(chain, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, graph=graph)
                        out["rows"].append(_row(sc, fam, "chain_us", tc.p20, tc.p50, tc.p80, "us", base,
                                                timing=tc.method))
                        msg += f"  chain {tc.p50:.1f} (act err {e_act:.1e})"
                    if args.also_eager:
                        te = timing.bench(both, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
                        out["rows"].append(_row(sc, fam, "time_us_eager", te.p20, te.p50, te.p80, "us", base,
                                                timing=te.method))
                        msg += f"  eager {te.p50:.1f}"
                    if args.host_time:
                        for name, fn in (("host_us_gate_up", gate_up), ("host_us_down", down)):
                            h = timing.host_time(fn, calls=args.host_calls)
                            out["rows"].append(_row(sc, fam, name, None, h.median_us, None, "us", base,
                                                    p90=h.p90_us, calls=h.calls))
                            msg += f"  {name} {h.median_us:.1f}"
                    if "failed" in t.method:
                        msg += f"  [{t.method}]"
                    _log(msg + f"  block_m {info.get('block_m')}  (first call {first_s:.1f}s)")
                except Exception as exc:  # keep going: one failure must not hide the other rows
                    _log(f"{sc.id} {fam}: ERROR {type(exc).__name__}: {exc}")
                    out["rows"].append(_row(sc, fam, "error", None, None, None, "", base,
                                            error=f"{type(exc).__name__}: {exc}",
                                            traceback=traceback.format_exc(limit=8)))
                flush()
            del data
        del weights, w13, w2
        torch.cuda.empty_cache()
    meta["finished"] = _now()
    flush()
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except WrongHumming as exc:
        print(f"humming_worker: refusing to run: {exc}", file=sys.stderr)
        return EXIT_WRONG_HUMMING
    return 0


if __name__ == "__main__":
    sys.exit(main())

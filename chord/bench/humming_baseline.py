"""Upstream Humming (humming-kernels 0.1.20), driven the way vLLM 0.33.0 drives it.

Run it as its own process, with the upstream install dir first on the path::

    pip install --no-deps --target /tmp/humming humming-kernels==0.1.20
    PYTHONPATH=/tmp/humming:$PWD python -P -m chord.bench.humming_baseline \\
        --humming-dir /tmp/humming --scenarios ep8-decode-tok1,tp8-m1 --json-out humming.json

Chord ships its own ``humming`` package (the vLLM-facing shim) under the same import name, so
this script puts ``--humming-dir`` first on ``sys.path`` itself, imports ``humming`` before
anything else, and refuses to run (exit status 3) unless ``humming.__file__`` lies inside that
dir and its version is 0.1.20. It never imports Chord's shim or kernels: only
``chord.routing`` / ``chord.formats`` (plain torch) through ``chord.bench.inputs``, so the
routing and data of a scenario are the same as in Chord's run for the same ``--seed``.

What vLLM 0.33.0 does, and what this script does in the same order
-------------------------------------------------------------------
Weights (compressed-tensors WNA16 MoE -> Humming backend, at load time, per sublayer w13/w2):

1. the checkpoint tensors ``weight_packed`` (int32 ``[E, N, K/8]``, 8 offset-binary codes per
   word, K-minor), ``weight_scale`` (bf16 ``[E, N, K/32]``) and ``weight_shape``;
2. weight schema from the checkpoint's quantization args: compressed-tensors, pack-quantized,
   int, 4 bits, group strategy, group 32, symmetric -> ``BaseWeightSchema.from_config``;
   input schema: ``HummingInputSchema()`` (vLLM's default, no ``VLLM_HUMMING_INPUT_QUANT_CONFIG``);
3. ``weight_schema.convert_humming(tensors, shape_n_stacks=[I, I] for the gated w13 / [N] for
   w2, shape_k_stacks=[K], param_dtype=bf16, num_experts=E)`` -- this also converts all-[-7, 7]
   INT4 weights to Humming's sign-magnitude 4-bit type -- and
   ``input_schema.convert_humming(...)``;
4. vLLM's input-schema check/fallback (bf16 activations: the schema stays as it is);
5. ``prepare_and_transform_humming_tensors(tensors, shape_n, shape_k, pad_n_to_multiple=256,
   pad_k_to_multiple=128, input_schema, weight_schema, has_bias=False, num_experts=E,
   torch_dtype=bf16, device)`` -> ``LayerConfig`` + kernel tensors;
6. tuning tables ``humming.tune.get_heuristics_config(layer_config, use_f16_accum=False,
   use_batch_invariant=False, gemm_type=<family>)`` (rows ``[lo, hi, config]``), and the compute
   config ``{"use_batch_invariant": false, "use_f16_accum": false, "gemm_type": <family>}``;
   locks: ``int32 zeros(8 * SMs)``.

Per forward (kernels only: activation, routing and permutation happen outside the timing):

* ``valid_shape_m`` = M * top_k (vLLM's ``estimate_local_valid_shape_m`` for this GPU);
* indexed: block size = ``block_shape[0]`` of the w13 row with ``lo < valid_shape_m <= hi``
  (64 if none), ``moe_align_block_size`` with it (here ``chord.routing.align_block_size`` with
  ``ignore_invalid_experts=True``, vLLM's contract); if the w2 table's row for the same
  ``valid_shape_m`` has another block size, a second alignment for w2. ``humming_forward`` for
  w13 (``top_k`` = routing top_k, input ``[M, K]``, output ``[M*top_k, 2I]``) then for w2
  (``top_k=1``, ``[M*top_k, I]`` -> ``[M*top_k, K]``), each with sorted_ids / expert_ids /
  num_tokens_padded, compute and tuning config strings, ``valid_shape_m`` and the locks;
* grouped_contiguous: rows permuted per expert with *unaligned* int64 offsets ``[E+1]`` (as
  vLLM's ``moe_prepare_scatter``), ``expert_layout=offsets``;
* grouped_masked: ``[E * max_rows, K]`` input with int32 ``expert_num_tokens`` as
  ``expert_layout``.

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

UPSTREAM_VERSION = "0.1.20"
PROVIDER = f"humming-{UPSTREAM_VERSION}"
EXIT_WRONG_HUMMING = 3

# The checkpoint's weight quantization (Kimi K2.x compressed-tensors, as vLLM hands it to Humming).
CT_WEIGHT_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "type": "int",
    "num_bits": 4,
    "strategy": "group",
    "group_size": 32,
    "symmetric": True,
}
# vLLM 0.33 defaults: VLLM_BATCH_INVARIANT=0, VLLM_HUMMING_USE_F16_ACCUM=0.
USE_BATCH_INVARIANT = False
USE_F16_ACCUM = False
PAD_N, PAD_K = 256, 128
DEFAULT_BLOCK = 64  # vLLM's fallback when no tuning row covers valid_shape_m


class WrongHumming(RuntimeError):
    """``import humming`` does not give upstream humming-kernels from ``--humming-dir``."""


# ---------------------------------------------------------------------------------------------
# arguments and the upstream import


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from chord import _env

    p = argparse.ArgumentParser(
        prog="python -m chord.bench.humming_baseline",
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
# weights: checkpoint tensors -> Humming layer (vLLM's load-time path)


class HummingLayer:
    """One MoE sublayer (w13 or w2) as vLLM holds it after ``process_weights_after_loading``."""

    def __init__(self, name: str, config, tensors: dict, weight_schema, input_schema, tables: dict):
        self.name = name
        self.config = config
        self.weight = tensors["weight"]
        self.weight_scale = tensors["weight_scale"]
        self.zero_point = tensors.get("zero_point")
        self.bias = tensors.get("bias")
        self.weight_scale_2 = tensors.get("weight_scale_2")
        self.weight_schema = weight_schema
        self.input_schema = input_schema
        self.tables = tables  # family -> [[lo, hi, config], ...]
        self.table_strs = {f: json.dumps(t) for f, t in tables.items()}
        self.subset_strs = dict(self.table_strs)

    def row_for(self, family: str, valid_shape_m: int):
        for lo, hi, cfg in self.tables[family]:
            if lo < valid_shape_m <= hi:
                return lo, hi, cfg
        return None

    def block_size(self, family: str, valid_shape_m: int) -> int:
        row = self.row_for(family, valid_shape_m)
        return int(row[2]["block_shape"][0]) if row is not None else DEFAULT_BLOCK

    def tuning_config(self, family: str, valid_shape_m: int, mode: str) -> str:
        """The tuning-config string passed to ``humming_forward`` (vLLM: the whole table)."""
        if mode == "all":
            return self.table_strs[family]
        return self.subset_strs[family]

    def set_needed(self, family: str, shapes) -> None:
        """For ``--tuning-rows matching``: keep only the rows that ``shapes`` select, widened to
        cover every M (first lo = 0, each hi = the next kept row's lo, last hi = 2**30). Every
        shape in ``shapes`` still lands in its own row, so the launcher picks the same kernel
        as with the whole table; Humming's JIT then compiles only those rows (in parallel)."""
        rows = []
        for v in sorted(set(shapes)):
            row = self.row_for(family, v)
            if row is not None and row not in rows:
                rows.append(row)
        if not rows:
            self.subset_strs[family] = self.table_strs[family]
            return
        rows.sort(key=lambda r: r[0])
        widened = []
        for i, (lo, hi, cfg) in enumerate(rows):
            lo2 = 0 if i == 0 else widened[-1][1]
            hi2 = (1 << 30) if i == len(rows) - 1 else rows[i + 1][0]
            widened.append([lo2, hi2, cfg])
        self.subset_strs[family] = json.dumps(widened)

    @property
    def b_dtype(self) -> str:
        return str(self.config.b_dtype)


def _check_and_fallback_input_schema(weight_schema, input_schema, param_dtype):
    """vLLM's ``check_and_fallback_input_schema`` for 16-bit activations (the W4A16 case)."""
    from humming import dtypes
    from humming.config import InputQuantizationMode
    from humming.schema import HummingInputSchema

    ws = weight_schema.to_humming_schema(param_dtype)
    ins = input_schema.to_humming_schema(param_dtype)
    if ins.a_dtype is not None and ins.a_dtype.num_bits != 16:
        raise ValueError(f"this baseline covers W4A16 only, got input schema {ins}")
    if ins.is_compatible_with(ws, param_dtype):
        return ins
    cand = HummingInputSchema(a_dtype=dtypes.DataType.from_torch_dtype(param_dtype), input_scale_group_size=0,
                              input_scale_dtype=None, input_quant_mode=InputQuantizationMode.Disabled)
    if cand.is_compatible_with(ws, param_dtype):
        return cand
    raise ValueError(f"no compatible Humming input schema for {ins} with weight schema {ws}")


def build_layer(name: str, q, scales, *, gated: bool, families, device) -> HummingLayer:
    """Checkpoint INT4 codes + scales -> a Humming layer, exactly through vLLM's load-time calls."""
    import torch
    from humming.config import GemmType
    from humming.schema import BaseWeightSchema, HummingInputSchema
    from humming.transform import prepare_and_transform_humming_tensors
    from humming.tune import get_heuristics_config

    from chord.formats import pack_compressed_tensors

    e, n, k = (int(v) for v in q.shape)
    param_dtype = torch.bfloat16
    packed = torch.empty(e, n, k // 8, dtype=torch.int32, device=device)
    for i in range(e):  # per expert keeps the packing temporaries small
        packed[i] = pack_compressed_tensors(q[i])
    checkpoint = {
        "weight_packed": packed,
        "weight_scale": scales.to(param_dtype),
        # vLLM registers weight_shape as a float parameter [E, 2]; the conversion ignores it.
        "weight_shape": torch.tensor([[n, k]] * e, dtype=torch.float32, device=device),
    }
    weight_schema = BaseWeightSchema.from_config(dict(CT_WEIGHT_CONFIG))
    input_schema = HummingInputSchema()
    n_stacks = [n // 2, n // 2] if gated else [n]
    ws, tensors = weight_schema.convert_humming(tensors=checkpoint, shape_n_stacks=n_stacks, shape_k_stacks=[k],
                                                param_dtype=param_dtype, num_experts=e)
    ins, in_tensors = input_schema.convert_humming(tensors=checkpoint, shape_n_stacks=n_stacks, shape_k_stacks=[k],
                                                   param_dtype=param_dtype, num_experts=e)
    tensors = {**tensors, **in_tensors}
    del checkpoint, packed
    ins = _check_and_fallback_input_schema(ws, ins, param_dtype)
    source = {key: v for key, v in tensors.items() if key not in ("input_scale", "input_scale_2")}
    config, out = prepare_and_transform_humming_tensors(
        tensors=source, shape_n=n, shape_k=k, pad_n_to_multiple=PAD_N, pad_k_to_multiple=PAD_K,
        input_schema=ins, weight_schema=ws, has_bias=False, num_experts=e, torch_dtype=param_dtype,
        device=tensors["weight"].device)
    del tensors, source
    tables = {}
    for fam in families:
        tables[fam] = get_heuristics_config(layer_config=config, use_f16_accum=USE_F16_ACCUM,
                                            use_batch_invariant=USE_BATCH_INVARIANT, gemm_type=GemmType(fam))
    torch.cuda.empty_cache()
    return HummingLayer(name, config, out, ws, ins, tables)


def compute_config(family: str) -> str:
    return json.dumps({"use_batch_invariant": USE_BATCH_INVARIANT, "use_f16_accum": USE_F16_ACCUM,
                       "gemm_type": family})


# ---------------------------------------------------------------------------------------------
# one scenario x family


def _forward(layer: HummingLayer, inputs, outputs, locks, **kw):
    from humming.forward import humming_forward

    return humming_forward(layer.config, inputs=inputs, weight=layer.weight, weight_scale=layer.weight_scale,
                           zero_point=layer.zero_point, bias=layer.bias, weight_scale_2=layer.weight_scale_2,
                           input_scale=None, input_scale_2=None, outputs=outputs, locks=locks, **kw)


def prepare_calls(family: str, sc, data, fi, w13: HummingLayer, w2: HummingLayer, locks, tuning_rows: str):
    """(gate_up(), down(), gate_up_out, down_out, info) for one family, as vLLM would call them."""
    import torch

    from chord import routing

    dev = data.device
    valid_shape_m = sc.rows
    cc = compute_config(family)
    tc13 = w13.tuning_config(family, valid_shape_m, tuning_rows)
    tc2 = w2.tuning_config(family, valid_shape_m, tuning_rows)
    info = {"valid_shape_m": valid_shape_m}
    for tag, layer in (("gate_up", w13), ("down", w2)):
        row = layer.row_for(family, valid_shape_m)
        info[f"humming_row_{tag}"] = None if row is None else {"lo": row[0], "hi": row[1], "config": row[2]}

    if family == "indexed":
        b13 = w13.block_size(family, valid_shape_m)
        b2 = w2.block_size(family, valid_shape_m)
        r13 = routing.align_block_size(data.topk_ids, b13, sc.experts, ignore_invalid_experts=True)
        r2 = r13 if b2 == b13 else routing.align_block_size(data.topk_ids, b2, sc.experts, ignore_invalid_experts=True)
        gu_out = torch.empty(sc.rows, sc.n_gate_up, dtype=torch.bfloat16, device=dev)
        dn_out = torch.empty(sc.rows, sc.n_down, dtype=torch.bfloat16, device=dev)
        x, dn_in = fi.gate_up_in, fi.down_in
        kw13 = dict(sorted_ids=r13.sorted_ids, expert_ids=r13.expert_ids, num_tokens_padded=r13.num_tokens_post_padded,
                    compute_config=cc, valid_shape_m=valid_shape_m, top_k=sc.top_k, tuning_config=tc13)
        kw2 = dict(sorted_ids=r2.sorted_ids, expert_ids=r2.expert_ids, num_tokens_padded=r2.num_tokens_post_padded,
                   compute_config=cc, valid_shape_m=valid_shape_m, top_k=1, tuning_config=tc2)
        info["block_m"] = [b13, b2]
    else:
        layout = fi.expert_offsets if family == "grouped_contiguous" else fi.expert_num_tokens
        x = fi.gate_up_in.reshape(-1, sc.k_gate_up)
        dn_in = fi.down_in.reshape(-1, sc.k_down)
        gu_out = torch.empty(x.shape[0], sc.n_gate_up, dtype=torch.bfloat16, device=dev)
        dn_out = torch.empty(x.shape[0], sc.n_down, dtype=torch.bfloat16, device=dev)
        kw13 = dict(valid_shape_m=valid_shape_m, expert_layout=layout, compute_config=cc, tuning_config=tc13)
        kw2 = dict(valid_shape_m=valid_shape_m, expert_layout=layout, compute_config=cc, tuning_config=tc2)
        if family == "grouped_masked":
            info["max_rows"] = int(fi.gate_up_in.shape[1])

    def gate_up():
        return _forward(w13, x, gu_out, locks, **kw13)

    def down():
        return _forward(w2, dn_in, dn_out, locks, **kw2)

    return gate_up, down, gu_out, dn_out, info


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

    from chord.bench import inputs as I
    from chord.bench import timing
    from chord.bench.suite import load_suite, scenarios_by_weights

    dev = torch.device(args.device)
    on_gpu = dev.type == "cuda"
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("humming_baseline needs a CUDA GPU")
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
        "provider": PROVIDER, "humming_file": str(Path(humming.__file__).resolve()),
        "humming_version": str(getattr(humming, "__version__", "unknown")), "torch": torch.__version__,
        "triton": triton_version, "gpu": gpu, "num_sms": num_sms, "python": platform.python_version(),
        "suite": suite.path, "seed": args.seed, "codes": args.codes, "tuning_rows": args.tuning_rows,
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
        w13 = build_layer("w13", weights.q13, weights.s13, gated=True, families=families, device=dev)
        w2 = build_layer("w2", weights.q2, weights.s2, gated=False, families=families, device=dev)
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
                    gate_up, down, gu_out, dn_out, info = prepare_calls(fam, sc, data, fi, w13, w2, locks,
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
        print(f"humming_baseline: refusing to run: {exc}", file=sys.stderr)
        return EXIT_WRONG_HUMMING
    return 0


if __name__ == "__main__":
    sys.exit(main())

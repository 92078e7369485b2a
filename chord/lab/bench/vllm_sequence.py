"""vLLM 0.33's load-time and per-forward sequence over the ``humming`` root this process imports.

Upstream Humming's worker (:mod:`chord.lab.bench.humming_worker`, a child process whose ``humming``
is humming-kernels 0.1.20) and Chord's own host-time measurement (:mod:`chord.lab.bench.host_time`,
whose ``humming`` is Chord's root) run the same calls from here; which ``humming`` answers is
the caller's business (each checks it first). Nothing here imports ``humming`` at import time.

What vLLM 0.33.0 does, and what this module does in the same order
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
"""
from __future__ import annotations

import json

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


def prepare_calls(family: str, sc, data, fi, w13: HummingLayer, w2: HummingLayer, locks, tuning_rows: str,
                  down_input=None):
    """(gate_up(), down(), gate_up_out, down_out, info) for one family, as vLLM would call them.
    `down_input`: down's input instead of the scenario's (the chain's activation output)."""
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

    if down_input is not None:
        dn_in = down_input

    def gate_up():
        return _forward(w13, x, gu_out, locks, **kw13)

    def down():
        return _forward(w2, dn_in, dn_out, locks, **kw2)

    return gate_up, down, gu_out, dn_out, info


# The activation vLLM 0.33 asks of the provider between gate_up and down (SiLU and mul, gate half
# then up half), as the experts class passes it to ``may_process_input``.
SILU_AND_MUL = {"activation_type": "binary_split", "activation_impl": "(a / (1.f + expf(-a))) * b"}


def prepare_chain(family: str, sc, data, fi, w13: HummingLayer, w2: HummingLayer, locks, tuning_rows: str):
    """(chain(), check()) for one family: the provider-owned part of one MoE layer's forward, in
    vLLM's order -- ``humming_forward`` for w13, ``may_process_input`` on w2's config with SiLU and
    mul (``layout`` "normal", or "grouped_mask" with the expert counts for the masked family) into
    the down input buffer, ``humming_forward`` for w2 on it. Routing, the w13 input's permutation
    and the weighted sum are vLLM's own kernels and stay outside. ``check()`` (after one chain())
    returns the activation output's relative error against its torch reference on the rows the
    layout marks valid."""
    import torch
    from humming.forward import may_process_input

    from chord.reference import silu_and_mul_ref

    rows = sc.rows if family == "indexed" else int(fi.gate_up_in.reshape(-1, sc.k_gate_up).shape[0])
    two_i = int(sc.n_gate_up)
    act = torch.empty(rows, two_i // 2, dtype=torch.bfloat16, device=data.device)
    gate_up, down, gu_out, dn_out, info = prepare_calls(family, sc, data, fi, w13, w2, locks, tuning_rows,
                                                        down_input=act)
    if family == "grouped_masked":
        layout = dict(layout="grouped_mask", expert_tokens=fi.expert_num_tokens)
    else:
        layout = dict(layout="normal")

    def chain():
        gate_up()
        may_process_input(w2.config, gu_out, outputs=act, **SILU_AND_MUL, **layout)
        down()

    def check() -> float:
        ref = silu_and_mul_ref(gu_out)
        valid = torch.ones(rows, dtype=torch.bool, device=act.device)
        if family == "grouped_masked":
            max_rows = rows // fi.expert_num_tokens.numel()
            r = torch.arange(rows, device=act.device)
            valid = (r % max_rows) < fi.expert_num_tokens.long()[r // max_rows]
        diff = (act.float()[valid] - ref[valid]).norm()
        return float(diff / ref[valid].norm().clamp_min(1e-30))

    return chain, check

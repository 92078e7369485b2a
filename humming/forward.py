"""``humming_forward`` and the input-processing entry points vLLM 0.33 calls per layer.

``humming_forward`` runs one GEMM of a layer on Chord's kernels, dispatched by
``compute_config["gemm_type"]``:

* ``indexed`` -> ``chord::gemm_indexed`` with vLLM's ``moe_align_block_size`` routing
  (``sorted_ids``, ``expert_ids``, ``num_tokens_padded``; gate_up with the routing top_k,
  down with top_k=1);
* ``grouped_contiguous`` -> ``chord::gemm_contiguous`` with ``expert_layout`` = expert offsets
  (int64 [E+1]);
* ``grouped_masked`` -> ``chord::gemm_masked`` with ``expert_layout`` = tokens per expert
  (int32 [E]) over inputs [E * max_rows, K];
* ``dense`` (a quantized linear layer) -> ``chord::gemm_contiguous`` with one expert.

The schedule comes from the tuning row vLLM used for its routing (same ``valid_shape_m``),
so ``block_m`` always matches ``moe_align_block_size``: the call's *layer decision* (family,
schedule id, block_m), memoized per layer config and ``valid_shape_m`` (``_DECISIONS``).

One eager call is one pass: the layer decision is looked up once (made on a miss), the call is
offered once to a launch plan of ``chord.launch`` (a repeated call launches from C there), and
on a miss it runs chord.ops' checked Python path (checks, kernel, launch record, launch), which
keeps the plan for the next call. Config parsing is cached and marked
constant for torch.compile; routing tensors are only read by the kernels, never on the host.
Outputs are written into the caller's ``outputs`` (when vLLM padded N or K, through a padded
temporary: the unpadded part is exact).
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Optional

import torch

from chord import checks

from humming import _chord, ops, tune
from humming.config import LayerConfig
from humming.errors import ChordUnsupportedError

__all__ = ["humming_forward", "may_process_input", "may_quant_input"]

_chord.load_ops()  # torch.ops.chord.* registered before anything is traced


def _as_key(config: Any, name: str = "compute_config") -> Optional[str]:
    if config is None or isinstance(config, str):
        return config or None
    try:
        return json.dumps(config, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"humming_forward: {name} must be a JSON string or a JSON-serializable dict/list, got "
                         f"{type(config).__name__} ({exc})") from None


def _json(name: str, text: str, expected: str) -> Any:
    """json.loads(text), or a ValueError naming the argument and what it must be."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError) as exc:
        raise ValueError(f"humming_forward: {name} must be {expected}; it is not valid JSON ({exc}): "
                         f"{_clip(text)}") from None


def _clip(text: Any, limit: int = 200) -> str:
    t = repr(text)
    return t if len(t) <= limit else t[:limit] + "..."


_TUNING_FORM = ("a JSON list of [min_m, max_m, config] rows (humming.tune.get_heuristics_config) or one config "
                "object")


@lru_cache(maxsize=256)
def _flags(compute_config: Optional[str]) -> tuple[str, bool]:
    """(gemm_type, batch-invariant mode) of a compute_config JSON."""
    cfg = _json("compute_config", compute_config, 'a JSON object like {"gemm_type": "indexed"}') if compute_config \
        else {}
    if not isinstance(cfg, dict):
        raise ValueError(f"humming_forward: compute_config must be a JSON object like {{\"gemm_type\": \"indexed\"}}, "
                         f"got {_clip(compute_config)}")
    invariant = tune.check_compute_flags(cfg.get("use_f16_accum", False), cfg.get("use_batch_invariant", False))
    return tune._gemm_type(cfg.get("gemm_type", "dense")).value, invariant


@lru_cache(maxsize=256)
def _tuning_rows(tuning_config: str) -> tuple:
    """The rows of a tuning_config JSON, each checked: [min_m, max_m, config] with int bounds, a
    config object holding a Chord schedule id, and block_shape[0] (the block size vLLM aligned its
    routing with) equal to that schedule's block_m."""
    from chord.schedule import Schedule

    rows = _json("tuning_config", tuning_config, _TUNING_FORM)
    if isinstance(rows, dict):  # a single config
        rows = [[-1, tune.MAX_ROWS, rows]]
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"humming_forward: tuning_config must be {_TUNING_FORM}, got {_clip(tuning_config)}")
    out = []
    for i, row in enumerate(rows):
        where = f"humming_forward: tuning_config row {i}"
        if not isinstance(row, list) or len(row) != 3:
            raise ValueError(f"{where} must be [min_m, max_m, config], got {_clip(row)}")
        lo, hi, cfg = row
        if not (checks.is_int(lo) and checks.is_int(hi)) or lo >= hi:
            raise ValueError(f"{where} must start with two ints min_m < max_m, got {_clip(row[:2])}")
        if not isinstance(cfg, dict):
            raise ValueError(f"{where}: config must be a JSON object, got {_clip(cfg)}")
        if "schedule" not in cfg:
            raise ChordUnsupportedError("A tuning config without a Chord schedule id (made by upstream Humming?)",
                                        "Let humming.tune.get_heuristics_config build the tuning rows.")
        try:
            sched = Schedule.from_id(cfg["schedule"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: schedule must be a Chord schedule id: {exc}") from None
        shape = cfg.get("block_shape")
        if not isinstance(shape, list) or not shape or not checks.is_int(shape[0]):
            raise ValueError(f"{where}: block_shape must be a list [block_m, block_n, 64], got {_clip(shape)}")
        if shape[0] != sched.block_m:
            raise ValueError(f"{where}: block_shape[0]={shape[0]} (the block size vLLM aligns its routing with) must "
                             f"equal schedule {sched.id}'s block_m={sched.block_m}")
        out.append((lo, hi, cfg))
    return tuple(out)


_DECISIONS: dict = {}  # (compute_config, tuning_config, experts, N, K, valid_shape_m) -> layer decision
_DECISIONS_MAX = 65536


@torch.compiler.assume_constant_result
def _gemm_kind(compute_config: Optional[str]) -> str:
    """gemm_type of a compute_config string (constant for torch.compile: JSON is not traceable)."""
    return _flags(compute_config)[0]


def _decision(compute_config: Optional[str], tuning_config: Optional[str], num_experts: int, shape_n: int,
              shape_k: int, valid_shape_m: int) -> tuple[str, str, int]:
    """The layer decision of one call, (family, schedule id, block_m): a pure function of host
    values, memoized (one dict lookup; made by :func:`_decide` on a miss).

    It runs inside :func:`_gemm` (an opaque custom op under torch.compile), so a symbolic
    ``valid_shape_m`` reaches it as a concrete int.
    """
    key = (compute_config, tuning_config, num_experts, shape_n, shape_k, valid_shape_m)
    decision = _DECISIONS.get(key)
    return decision if decision is not None else _decide(key)


def _decide(key: tuple) -> tuple[str, str, int]:
    """Make and memoize the layer decision of `key` (see _DECISIONS): the tuning row vLLM used
    for ``valid_shape_m`` (its rows, or Chord's rows for the layer when vLLM passed none), checked
    against the compute config's family and batch-invariant mode."""
    compute_config, tuning_config, num_experts, shape_n, shape_k, valid_shape_m = key
    gemm_type, invariant = _flags(compute_config or None)
    family = tune.family_for(gemm_type, num_experts)
    rows = (_tuning_rows(tuning_config) if tuning_config
            else tune.rows_for(family, num_experts or 1, shape_n, shape_k, invariant))
    if invariant and len({cfg["schedule"] for _, _, cfg in rows}) > 1:
        raise ValueError("compute_config asks for batch-invariant mode (use_batch_invariant), but tuning_config "
                         "has several schedules over M: build it with humming.tune.get_heuristics_config("
                         "..., use_batch_invariant=True)")
    cfg = tune.row_for(rows, valid_shape_m)
    made_for = _chord.schedule_family(cfg["schedule"])
    if cfg.get("family", made_for) != made_for or made_for != family:
        raise ValueError(f"humming_forward: tuning_config was made for the {made_for} family (schedule "
                         f"{cfg['schedule']}), but compute_config asks for {gemm_type}")
    decision = (family, cfg["schedule"], int(cfg["block_shape"][0]))
    if len(_DECISIONS) > _DECISIONS_MAX:
        _DECISIONS.clear()
    _DECISIONS[key] = decision
    return decision


def _refuse_unsupported_args(zero_point, bias, weight_scale_2, input_scale, input_scale_2,
                             hadamard_block_size) -> None:
    for name, value in (("zero_point", zero_point), ("bias", bias), ("weight_scale_2", weight_scale_2),
                        ("input_scale", input_scale), ("input_scale_2", input_scale_2)):
        if value is not None:
            raise ChordUnsupportedError(f"humming_forward with {name}")
    if hadamard_block_size is not None and hadamard_block_size > 1:
        raise ChordUnsupportedError(f"Hadamard rotation (hadamard_block_size={hadamard_block_size})")


def humming_forward(
    config: LayerConfig,
    inputs: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: Optional[torch.Tensor] = None,
    zero_point: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    weight_scale_2: Optional[torch.Tensor] = None,
    outputs: Optional[torch.Tensor] = None,
    input_scale: Optional[torch.Tensor] = None,
    input_scale_2: Optional[torch.Tensor] = None,
    sorted_ids: Optional[torch.Tensor] = None,
    expert_ids: Optional[torch.Tensor] = None,
    num_tokens_padded: Optional[torch.Tensor] = None,
    expert_layout: Optional[torch.Tensor] = None,
    locks: Optional[torch.Tensor] = None,
    top_k: int = 1,
    valid_shape_m: int = 0,
    compute_config: Any = None,
    tuning_config: Any = None,
    hadamard_block_size: Optional[int] = None,
    use_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """One W4A16 GEMM of `config` on Chord's kernels, written into (and returning) `outputs`.

    Argument dtypes, devices and contiguity are checked by the op itself (chord.ops) before launch.
    """
    decision = planned = None  # not looked up yet (decision False: looked up, not made yet)
    if (not torch.compiler.is_compiling() and type(valid_shape_m) is int and valid_shape_m > 0
            and type(compute_config) is str
            and type(tuning_config) is str and type(config) is LayerConfig and outputs is not None
            and zero_point is None and bias is None and weight_scale_2 is None and input_scale is None
            and input_scale_2 is None and hadamard_block_size is None):
        # the eager fast path of a repeated call: the layer decision, then its launch plan
        decision = _DECISIONS.get((compute_config, tuning_config, config.num_experts, config.shape_n,
                                   config.shape_k, valid_shape_m), False)
        if decision:
            planned = _launched(decision, config, inputs, weight, weight_scale, outputs, sorted_ids, expert_ids,
                                num_tokens_padded, expert_layout, top_k)
            if planned:
                return outputs
    if (zero_point is not None or bias is not None or weight_scale_2 is not None or input_scale is not None
            or input_scale_2 is not None or (hadamard_block_size is not None and hadamard_block_size > 1)):
        _refuse_unsupported_args(zero_point, bias, weight_scale_2, input_scale, input_scale_2, hadamard_block_size)
    if not isinstance(config, LayerConfig):
        raise TypeError(f"humming_forward: config must be a humming LayerConfig (from "
                        f"prepare_and_transform_humming_tensors), got {type(config).__name__}")
    if inputs.dtype != torch.bfloat16:
        raise ChordUnsupportedError(f"humming_forward on {inputs.dtype} inputs", "Chord reads bf16 activations.")
    if weight_scale is None:
        raise ValueError("humming_forward: weight_scale is required (the layer's 'weight_scale' tensor)")
    if type(top_k) is not int or top_k < 1:  # refused as chord.ops refuses it (a traced SymInt passes)
        if not (torch.compiler.is_compiling() and isinstance(top_k, torch.SymInt)):
            checks.top_k("humming_forward", top_k)
    check_layer_tensors(config, weight, weight_scale)

    kn, kk = config.shape_n, config.shape_k
    x = inputs
    if x.shape[-1] != kk:
        k = config.k
        if x.shape[-1] != k:
            raise ValueError(f"humming_forward: inputs must have K={k} (or padded {kk}) columns, got {tuple(x.shape)}")
        x = torch.nn.functional.pad(x, (0, kk - k))
    elif not x.is_contiguous():
        x = x.contiguous()
    if x.dim() != 2 and not (x.dim() == 3 and expert_layout is not None):
        x = x.reshape(-1, kk)

    compute_key = compute_config if compute_config is None or type(compute_config) is str else _as_key(compute_config)
    tuning_key = (tuning_config if tuning_config is None or type(tuning_config) is str
                  else _as_key(tuning_config, "tuning_config"))
    gemm = _gemm_kind(compute_key)
    if gemm == "indexed":
        if sorted_ids is None or expert_ids is None or num_tokens_padded is None:
            raise ValueError("humming_forward: the indexed GEMM needs sorted_ids, expert_ids and num_tokens_padded "
                             "(vLLM's moe_align_block_size outputs)")
        rows_out = x.shape[0] * top_k
    else:
        if gemm != "dense" and expert_layout is None:
            raise ValueError(f"humming_forward: the {gemm} GEMM needs expert_layout (expert offsets int64 [E+1] for "
                             "grouped_contiguous, tokens per expert int32 [E] for grouped_masked)")
        rows_out = x.numel() // kk
    m = valid_shape_m if valid_shape_m is not None and valid_shape_m > 0 else rows_out

    if outputs is None:
        n = config.n
        outputs = torch.empty((rows_out, n) if x.dim() == 2 else (*x.shape[:-1], n), dtype=torch.bfloat16,
                              device=x.device)
    out = outputs
    through_temp = outputs.shape[-1] != kn or not outputs.is_contiguous()
    if through_temp:  # vLLM padded N: run into a padded temporary
        if outputs.shape[-1] != config.n:
            raise ValueError(f"humming_forward: outputs must have N={config.n} (or padded {kn}) columns, got "
                             f"{tuple(outputs.shape)}")
        out = torch.empty((*outputs.shape[:-1], kn), dtype=torch.bfloat16, device=x.device)
    if gemm != "grouped_masked" and out.dim() != 2:
        out = out.view(-1, kn)
    if gemm == "dense":  # one expert covering every row
        expert_layout = torch.arange(2, dtype=torch.int64, device=x.device) * x.shape[0]

    args = (x, weight, weight_scale, out, sorted_ids, expert_ids, num_tokens_padded, expert_layout, int(top_k), m,
            compute_key or "", tuning_key or "", config.num_experts, kn, kk)
    if torch.compiler.is_compiling():
        torch.ops.chord.humming_gemm(*args)
    else:  # eager: skip the custom-op dispatcher round trip; what the fast path found is not looked up again
        _gemm(*args, decision=decision,
              planned=planned is False and x is inputs and out is outputs)

    if through_temp:
        outputs.copy_(out.view(*outputs.shape[:-1], kn)[..., : outputs.shape[-1]])
    return outputs


_LAYERS_CHECKED: dict = {}


def check_layer_tensors(config: LayerConfig, weight: Any, weight_scale: Any, fn: str = "humming_forward") -> None:
    """The kernel tensors must be the layer's: `weight` (swap16g ``[E, N/16/G, K/64, G, 32, 4]``)
    and `weight_scale` of the config's experts and padded N and K, and for a layer padded along N
    (``pad_shape_n``) zero scales in the padding rows, as
    :func:`humming.transform.prepare_and_transform_humming_tensors` writes them: another layer's
    weights of the padded size would fill them. Checked once per (layer shape, weight tensor) and
    remembered (a later call is one dict lookup); the padding (one device reduction over the
    padding rows) outside CUDA-graph capture and torch.compile tracing. Other problems of the
    tensors (dtype, device, layout) are chord.ops' to name."""
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 6 and isinstance(weight_scale, torch.Tensor)
            and weight_scale.dim() == 7):
        return
    compiling = torch.compiler.is_compiling()
    # under torch.compile the shapes are checked (traced once per graph) but nothing is memoized:
    # a data pointer is no dict key Dynamo can trace
    key = None if compiling else (config.num_experts, config.shape_n, config.shape_k, config.pad_shape_n,
                                  weight.shape, weight_scale.shape,
                                  weight_scale.data_ptr() if checks.has_memory(weight_scale) else None,
                                  weight_scale.device)
    if key is not None and key in _LAYERS_CHECKED:  # this layer's tensors, seen before: one dict lookup per call
        return
    e, ng, kb, g = (int(v) for v in weight.shape[:4])
    want = (config.kernel_experts, config.shape_n, config.shape_k)
    got = (e, ng * g * 16, kb * 64)
    for i, name in enumerate(("experts", "N (padded)", "K (padded)")):
        if got[i] != want[i]:
            raise ValueError(f"{fn}: weight must be this layer's, with {want[i]} {name} (its LayerConfig: "
                             f"num_experts={config.num_experts}, shape_n={config.shape_n}, shape_k={config.shape_k}), "
                             f"got {got[i]} (weight shape {tuple(weight.shape)}): another layer's weights?")
    if tuple(weight_scale.shape[:4]) != tuple(weight.shape[:4]):
        raise ValueError(f"{fn}: weight_scale must match weight [E, N/16/G, K/64, G] = {tuple(weight.shape[:4])}, got "
                         f"shape {tuple(weight_scale.shape)}")
    if config.pad_shape_n:
        if compiling or key[6] is None or (weight_scale.is_cuda and torch.cuda.is_current_stream_capturing()):
            return  # no values to read now: checked at the next eager call
        if not _chord.padding_scales_zero(weight_scale, config.n):
            raise ValueError(f"{fn}: weight_scale must be zero in the N padding of this layer (features {config.n}.."
                             f"{config.shape_n - 1}; LayerConfig pad_shape_n={config.pad_shape_n}), but it is not: "
                             "weights of another layer of the padded size?")
    if key is None:
        return
    if len(_LAYERS_CHECKED) >= 4096:
        _LAYERS_CHECKED.clear()
    _LAYERS_CHECKED[key] = True


def _launched(decision: tuple, config: LayerConfig, inputs, weight, weight_scale, outputs, sorted_ids, expert_ids,
              num_tokens_padded, expert_layout, top_k: int) -> Optional[bool]:
    """The eager fast path of a repeated call whose layer decision is made: the tensors exactly as
    given offered to chord's launch plans (chord.launch, csrc/host/launch.c). A plan matches only
    tensors of the same dtypes, devices, shapes, strides and alignment as a call chord.ops
    validated and launched, so inputs that humming_forward would pad, make contiguous or reshape,
    or outputs it would route through a temporary, never match: they miss and take the path below,
    as do dense layers (their expert layout is made per call). True: launched (or nothing to
    launch); False: offered, no plan; None: not offered."""
    if weight.shape[0] != config.num_experts:  # another layer's weights: the path below refuses them
        return None
    family, schedule, block_m = decision
    if family == "indexed":
        return _chord.try_planned_indexed(schedule, top_k, block_m, inputs, weight, weight_scale, sorted_ids,
                                          expert_ids, num_tokens_padded, outputs) if type(top_k) is int else None
    if not config.num_experts:  # dense
        return None
    return _chord.try_planned_grouped(family, schedule, inputs, weight, weight_scale, expert_layout, outputs)


def _gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, out: torch.Tensor,
          sorted_ids: Optional[torch.Tensor], expert_ids: Optional[torch.Tensor],
          num_tokens_padded: Optional[torch.Tensor], expert_layout: Optional[torch.Tensor], top_k: int,
          valid_shape_m: int, compute_config: str, tuning_config: str, num_experts: int, shape_n: int,
          shape_k: int, decision: "tuple | bool | None" = None, planned: bool = False) -> None:
    """Run the family's op on the schedule of the row vLLM used (kernel-shaped x and out).

    `decision`: the layer decision if humming_forward's fast path found it, False if it looked and
    found none (made here without a second lookup), None if it did not look. `planned`: these very
    tensors were offered to a launch plan and missed, so chord.ops' checked path runs without a
    second offer."""
    if decision is False:
        decision = _decide((compute_config, tuning_config, num_experts, shape_n, shape_k, int(valid_shape_m)))
    elif decision is None:
        decision = _decision(compute_config, tuning_config, num_experts, shape_n, shape_k, int(valid_shape_m))
    family, schedule, block_m = decision
    if family == "indexed":
        _chord.gemm_indexed(x, weight, weight_scale, sorted_ids, expert_ids, num_tokens_padded, out, top_k, block_m,
                            schedule, planned=planned)
    elif family == "grouped_masked":
        _chord.gemm_masked(x, weight, weight_scale, expert_layout, out, schedule, planned=planned)
    else:  # grouped_contiguous, and dense layers as one expert
        _chord.gemm_contiguous(x, weight, weight_scale, expert_layout, out, schedule, planned=planned)


@torch.library.custom_op("chord::humming_gemm", mutates_args=("out",))
def _humming_gemm_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, out: torch.Tensor,
                     sorted_ids: Optional[torch.Tensor], expert_ids: Optional[torch.Tensor],
                     num_tokens_padded: Optional[torch.Tensor], expert_layout: Optional[torch.Tensor], top_k: int,
                     valid_shape_m: int, compute_config: str, tuning_config: str, num_experts: int, shape_n: int,
                     shape_k: int) -> None:
    """humming_forward's GEMM as one op for torch.compile: the tuning row is looked up at run time, so a
    dynamic ``valid_shape_m`` is fine (argument checks run in chord's op it calls)."""
    _gemm(x, weight, weight_scale, out, sorted_ids, expert_ids, num_tokens_padded, expert_layout, top_k,
          valid_shape_m, compute_config, tuning_config, num_experts, shape_n, shape_k)


@_humming_gemm_op.register_fake
def _(x, weight, weight_scale, out, sorted_ids, expert_ids, num_tokens_padded, expert_layout, top_k, valid_shape_m,
      compute_config, tuning_config, num_experts, shape_n, shape_k) -> None:
    return None


def may_process_input(
    config: LayerConfig,
    inputs: torch.Tensor,
    *,
    outputs: Optional[torch.Tensor] = None,
    group_scales: Optional[torch.Tensor] = None,
    token_scales: Optional[torch.Tensor] = None,
    activation_type: str = "none",
    activation_impl: Optional[str] = None,
    hadamard_block_size: Optional[int] = None,
    layout: str = "normal",
    expert_tokens: Optional[torch.Tensor] = None,
    scatter_idx: Optional[torch.Tensor] = None,
    num_valid_tokens: Optional[torch.Tensor] = None,
    zero_invalid: bool = False,
    m_major_scale: bool = False,
    use_pdl: Optional[bool] = None,
) -> tuple[torch.Tensor, None, None]:
    """Activation / scatter / valid-row bounds before a GEMM; returns ``(inputs_for_gemm, None, None)``.

    With nothing to do, returns ``inputs`` (or copies them into ``outputs`` when one is given).
    """
    if config.input_quant_mode.should_quantize:
        raise ChordUnsupportedError(f"Input quantization ({config.input_quant_mode.value})")
    if hadamard_block_size is not None and hadamard_block_size > 1:
        raise ChordUnsupportedError(f"Hadamard rotation (hadamard_block_size={hadamard_block_size})")
    should_process = (activation_type != "none" or layout == "scatter" or num_valid_tokens is not None
                      or (layout == "grouped_mask" and zero_invalid))
    if not should_process:
        if outputs is not None and outputs is not inputs:
            outputs.copy_(inputs.view_as(outputs))
            return outputs, None, None
        return inputs, None, None
    return ops.process_input(
        inputs, outputs=outputs, activation_type=activation_type, activation_impl=activation_impl, layout=layout,
        expert_tokens=expert_tokens, scatter_idx=scatter_idx, num_valid_tokens=num_valid_tokens,
        zero_invalid=zero_invalid)


def may_quant_input(
    config: LayerConfig,
    inputs: torch.Tensor,
    input_scale: Optional[torch.Tensor] = None,
    quanted_input: Optional[torch.Tensor] = None,
    use_pdl: Optional[bool] = None,
) -> tuple[torch.Tensor, None]:
    """Chord's layers read bf16 activations: nothing to quantize."""
    if config.input_quant_mode.should_quantize or input_scale is not None:
        raise ChordUnsupportedError("Pre-quantized or quantized inputs (may_quant_input with an input scale)")
    return inputs, None

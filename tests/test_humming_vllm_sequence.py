"""vLLM 0.33's Humming MoE call sequence, run through Chord's `humming` root, against chord.reference.

The functions prefixed ``vllm_`` re-enact what vLLM 0.33.0 does with the `humming` facade, as
read from its code (vllm/model_executor/layers/quantization/utils/humming/{moe,schema}.py,
.../quantization/humming.py and .../fused_moe/experts/fused_humming_moe.py): load
(checkpoint schema -> convert_humming -> input-schema check -> prepare_and_transform), expert
init (compute_config + get_heuristics_config rows, JSON strings), and apply for the three
experts classes (indexed, grouped contiguous, batched grouped masked): workspaces carved
exactly as vLLM carves them (so buffers alias the same way) and poisoned with NaN, routing
built by vLLM's rules (moe_align block size from the w13 tuning row, re-aligned for w2 if its
row differs, expert_map with ignore_invalid_experts, scatter index), may_process_input for the
activation, humming_forward for w13 (routing top_k) and w2 (top_k=1), then the weighted sum.

The layer is Kimi-shaped (gate_up [E, 2I, H], down [E, H, I], int4 group 32, bf16 scales, top-k
routing) and its weights are real compressed-tensors pack-quantized tensors, made with the
`compressed-tensors` library's own quantizer and PackedQuantizationCompressor.

On a machine without a CUDA device (CI) the three GEMMs run on chord's float32 reference via
``humming._chord.cpu_reference_backend()`` -- everything up to the kernel call is the real
code; the GPU tests (marker ``gpu``) run the same sequence on Chord's kernels.
"""
from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch

pytest.importorskip("compressed_tensors")

from humming import _chord  # noqa: E402

BF16 = torch.bfloat16
SILU_ACTIVATION = {"activation_type": "binary_split", "activation_impl": "(a / (1.f + expf(-a))) * b"}

# Kimi K2.x's checkpoint quantization_config (config_groups trimmed to the one group)
KIMI_QUANT_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"], "input_activations": None, "output_activations": None,
        "weights": {"num_bits": 4, "type": "int", "symmetric": True, "group_size": 32, "strategy": "group",
                    "block_structure": None, "dynamic": False, "actorder": None, "observer": "minmax",
                    "observer_kwargs": {}},
    }},
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
}


# --------------------------------------------------------------------------------------------
# checkpoint: real compressed-tensors tensors


def ct_compress(w: torch.Tensor, group_size: int | None = 32):
    """compressed-tensors' own symmetric int4 quantizer + PackedQuantizationCompressor on one [N, K] weight."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    if group_size:
        args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=group_size)
        groups = w.unflatten(-1, (-1, group_size))
        scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
    else:
        args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="channel")
        scale, zp = calculate_qparams(w.amin(-1, keepdim=True), w.amax(-1, keepdim=True), args)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    out = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme)
    return out["weight_packed"], out["weight_scale"], out["weight_shape"]


def make_checkpoint(num_experts: int, hidden: int, inter: int, group_size: int | None, device):
    """Per sublayer: stacked CT tensors (what vLLM's loader puts in w13_/w2_ params) + exact QuantizedExperts."""
    from chord.formats import QuantizedExperts, unpack_compressed_tensors

    g = torch.Generator().manual_seed(1234)
    out = {}
    for name, (n, k) in {"w13": (2 * inter, hidden), "w2": (hidden, inter)}.items():
        packs, scales, shapes = [], [], []
        for _ in range(num_experts):
            w = (torch.randn(n, k, generator=g) * 0.05).to(BF16).to(device)
            p, s, sh = ct_compress(w, group_size)
            packs.append(p), scales.append(s), shapes.append(sh)
        packed, scale = torch.stack(packs), torch.stack(scales)
        q = unpack_compressed_tensors(packed, k)
        reps = (group_size or k) // 32
        exact = QuantizedExperts(q, scale.repeat_interleave(reps, -1) if reps > 1 else scale.expand(-1, -1, k // 32)
                                 if group_size is None else scale)
        out[name] = {"tensors": {"weight_packed": packed, "weight_scale": scale,
                                 "weight_shape": torch.stack(shapes).to(device)},
                     "exact": exact, "n": n, "k": k}
    return out


# --------------------------------------------------------------------------------------------
# vLLM 0.33 load path (utils/humming/moe.py convert_to_humming_moe_kernel_format)


def vllm_compressed_tensors_get_config(config: dict, key: str):
    """vllm/model_executor/layers/quantization/humming.py: compressed_tensors_get_config."""
    for group in config["config_groups"].values():
        if "Linear" in group["targets"]:
            if group.get(key) is None:
                return None
            out = dict(group[key])
            out["quant_method"] = config["quant_method"]
            out["format"] = config["format"]
            return out
    return None


def vllm_check_and_fallback_input_schema(weight_schema, input_schema, param_dtype, allow_fallback=True):
    """vLLM's check_and_fallback_input_schema, the parts a bf16 W4A16 layer reaches."""
    from humming import dtypes
    from humming.schema import HummingInputSchema

    weight_schema = weight_schema.to_humming_schema(param_dtype)
    input_schema = input_schema.to_humming_schema(param_dtype)
    a_dtype = input_schema.a_dtype
    _ = (weight_schema.weight_scale_group_size, input_schema.input_scale_group_size, input_schema.input_scale_dtype)
    if input_schema.is_compatible_with(weight_schema, param_dtype):
        if not allow_fallback or a_dtype is None or a_dtype.num_bits == 16:
            return input_schema
    # last fallback candidate: the param dtype, unquantized
    candidate = HummingInputSchema(a_dtype=dtypes.DataType.from_any(param_dtype), input_scale_group_size=0,
                                   input_scale_dtype=None, input_quant_mode="none")
    assert candidate.is_compatible_with(weight_schema, param_dtype)
    return candidate


def vllm_load(checkpoint: dict, *, entry: str, num_experts: int, hidden: int, inter: int, device):
    """Returns (params {'w13_weight', 'w13_weight_scale', ...}, humming_configs, weight/input schemas)."""
    from humming.schema import BaseInputSchema, BaseWeightSchema, HummingInputSchema, HummingWeightSchema
    from humming.transform import prepare_and_transform_humming_tensors

    param_dtype = BF16
    if entry == "moe-backend":  # compressed-tensors WNA16 method -> int_wna16 oracle -> _humming_wna16_weight_schema
        wq = KIMI_QUANT_CONFIG["config_groups"]["group_0"]["weights"]
        quant_config = {"quant_method": "compressed-tensors", "format": "pack-quantized", "type": wq["type"],
                        "num_bits": wq["num_bits"], "strategy": wq["strategy"], "group_size": wq["group_size"],
                        "symmetric": wq["symmetric"]}
        if checkpoint["w13"]["tensors"]["weight_scale"].shape[-1] == 1:
            quant_config.update(strategy="channel", group_size=None)
        elif checkpoint["w13"]["k"] // checkpoint["w13"]["tensors"]["weight_scale"].shape[-1] != 32:
            quant_config["group_size"] = checkpoint["w13"]["k"] // checkpoint["w13"]["tensors"]["weight_scale"].shape[-1]
        weight_schema = BaseWeightSchema.from_config(quant_config)
        input_schema = HummingInputSchema()  # VLLM_HUMMING_INPUT_QUANT_CONFIG unset -> layer skipped
        allow_fallback = True
    else:  # --quantization humming: HummingConfig.get_quant_config_for_layer + HummingMoEMethod
        layer_cfg = vllm_compressed_tensors_get_config(KIMI_QUANT_CONFIG, "weights")
        weight_schema = BaseWeightSchema.from_config(layer_cfg)
        input_cfg = vllm_compressed_tensors_get_config(KIMI_QUANT_CONFIG, "input_activations")
        input_schema = BaseInputSchema.from_config(input_cfg) if input_cfg else HummingInputSchema()
        allow_fallback = True
        # create_weights: parameters vLLM allocates must take the checkpoint tensors as they are
        for name, cp in checkpoint.items():
            attrs = weight_schema.get_padded_tensors_attrs(shape_n=cp["n"], shape_k=cp["k"], num_experts=num_experts,
                                                           param_dtype=param_dtype, has_bias=False)
            assert set(attrs) == {"weight_packed", "weight_scale", "weight_shape"}
            for key, t in cp["tensors"].items():
                assert tuple(attrs[key]["shape"]) == tuple(t.shape), (name, key)
                assert attrs[key]["dtype"] == t.dtype or key == "weight_shape", (name, key)
            assert attrs["weight_scale"]["extra_attrs"]["scale_type"] in ("group", "channel")
        # weight_schema_to_quant_key
        h = weight_schema.to_humming_schema(param_dtype)
        assert (str(h.b_dtype), h.weight_scale_type.value, h.weight_scale_2_type.value, h.has_zero_point) == \
            ("uint4", "group", "none", False)

    params, configs, weight_schemas, input_schemas = {}, {}, {}, {}
    for sub, cp in checkpoint.items():
        shape_n, shape_k = cp["n"], cp["k"]
        tensors = dict(cp["tensors"])
        n_stacks = [shape_n // 2] * 2 if sub == "w13" else [shape_n]
        ws, converted = weight_schema.convert_humming(tensors=tensors, shape_n_stacks=n_stacks,
                                                      shape_k_stacks=[shape_k], param_dtype=param_dtype,
                                                      num_experts=num_experts)
        is_, input_tensors = input_schema.convert_humming(tensors=tensors, shape_n_stacks=n_stacks,
                                                          shape_k_stacks=[shape_k], param_dtype=param_dtype,
                                                          num_experts=num_experts)
        converted.update(input_tensors)
        assert isinstance(ws, HummingWeightSchema)
        is_ = vllm_check_and_fallback_input_schema(ws, is_, param_dtype, allow_fallback)
        source = dict(converted)
        for name in ("input_scale", "input_scale_2"):
            if name != is_.static_tensor_scale_name:
                source.pop(name, None)
        config, out = prepare_and_transform_humming_tensors(
            tensors=source, shape_n=shape_n, shape_k=shape_k, pad_n_to_multiple=256, pad_k_to_multiple=128,
            input_schema=is_, weight_schema=ws, has_bias=False, num_experts=num_experts, torch_dtype=param_dtype,
            device=converted["weight"].device)
        params.update({f"{sub}_{k}": v for k, v in out.items()})
        configs[sub], weight_schemas[sub], input_schemas[sub] = config, ws, is_

    # get_humming_moe_quant_config reads these
    assert input_schemas["w13"].a_dtype is None or input_schemas["w13"].a_dtype.num_bits == 16
    assert str(weight_schemas["w13"].b_dtype) == "uint4"
    assert weight_schemas["w13"].weight_scale_group_size_n == 0
    assert weight_schemas["w13"].hadamard_block_size in (0, 1)
    return params, configs


# --------------------------------------------------------------------------------------------
# vLLM 0.33 experts (fused_humming_moe.py)


class VllmExperts:
    """HummingExpertsBase + one of the three subclasses, reduced to what touches `humming`."""

    def __init__(self, gemm_type: str, params: dict, configs: dict, *, global_num_experts: int,
                 max_num_tokens: int | None = None, num_dispatchers: int = 1, batch_invariant: bool = False):
        from humming.config import GemmType
        from humming.tune import get_heuristics_config

        self.gemm_type = GemmType(gemm_type)
        self.params, self.configs = params, configs
        self.num_experts = configs["w13"].num_experts
        self.global_num_experts = global_num_experts
        self.max_num_tokens, self.num_dispatchers = max_num_tokens, num_dispatchers
        # init_humming_moe
        # (VLLM_BATCH_INVARIANT=1 sets use_batch_invariant in both)
        self.compute_config = {"use_batch_invariant": batch_invariant, "use_f16_accum": False,
                               "gemm_type": self.gemm_type.value}
        self.w13_tuning_config = get_heuristics_config(layer_config=configs["w13"], use_f16_accum=False,
                                                       use_batch_invariant=batch_invariant, gemm_type=self.gemm_type)
        self.w2_tuning_config = get_heuristics_config(layer_config=configs["w2"], use_f16_accum=False,
                                                      use_batch_invariant=batch_invariant, gemm_type=self.gemm_type)
        self.compute_config_str = json.dumps(self.compute_config)
        self.w13_tuning_config_str = json.dumps(self.w13_tuning_config)
        self.w2_tuning_config_str = json.dumps(self.w2_tuning_config)
        assert configs["w13"].num_experts == configs["w2"].num_experts  # moe_problem_size
        assert params["w13_weight"].size(0) == self.num_experts and params["w2_weight"].size(0) == self.num_experts

    def is_batched(self) -> bool:
        return self.gemm_type.value == "grouped_masked"

    # ---- process_input / humming_forward as in HummingExpertsBase
    def process_input(self, sub, inputs, quanted_input, expert_tokens=None, activation=None, scatter_idx=None,
                      num_valid_tokens=None):
        from humming.forward import may_process_input

        config = self.configs[sub]
        kwargs = dict(activation) if activation is not None else {}
        mode = config.input_quant_mode
        layout = "grouped_mask" if self.is_batched() else "normal"
        if scatter_idx is not None:
            layout = "scatter"
        has_input_processing = (mode.should_quantize or activation is not None or scatter_idx is not None
                                or num_valid_tokens is not None)
        inputs, group_scales, token_scales = may_process_input(
            config, inputs=inputs, outputs=quanted_input if has_input_processing else None, token_scales=None,
            hadamard_block_size=0, layout=layout, expert_tokens=expert_tokens if layout == "grouped_mask" else None,
            scatter_idx=scatter_idx, num_valid_tokens=num_valid_tokens, **kwargs)
        input_scale = group_scales if mode.has_group_scale else token_scales
        input_scale_2 = token_scales if mode.has_secondary_scale else None
        return inputs, input_scale, input_scale_2

    def humming_forward(self, sub, inputs, input_scale, outputs, input_scale_2=None, **kwargs):
        from humming.forward import humming_forward

        return humming_forward(self.configs[sub], inputs=inputs, weight=self.params[f"{sub}_weight"],
                               weight_scale=self.params[f"{sub}_weight_scale"], zero_point=None, bias=None,
                               weight_scale_2=None, input_scale=input_scale, input_scale_2=input_scale_2,
                               outputs=outputs, locks=self.locks, **kwargs)

    def estimate_local_valid_shape_m(self, topk_ids):
        return math.ceil(topk_ids.size(0) * topk_ids.size(1) * self.num_experts / self.global_num_experts)

    # ---- get_buffer_metas + make_workspaces + prepare_buffers (aliasing as in vLLM)
    def buffers(self, M, topk, device):
        from humming import dtypes

        w13, w2 = self.configs["w13"], self.configs["w2"]
        gate_up_dim = w13.shape_n - w13.pad_shape_n
        inter = w2.shape_k - w2.pad_shape_k
        K = w13.shape_k - w13.pad_shape_k
        assert inter == gate_up_dim // 2
        if self.is_batched():
            real_m = self.num_experts * self.max_num_tokens * self.num_dispatchers
            input_m = real_m
            out_shape = (self.num_experts, self.max_num_tokens * self.num_dispatchers, K)
        else:
            input_m = M if self.gemm_type.value == "indexed" else M * topk
            real_m = M * topk
            out_shape = (M, K)
        dmap = {dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16, dtypes.float32: torch.float32}
        metas = {
            "quanted_gate_up_input": ((input_m, K), dmap[w13.a_dtype]),
            "gate_up_output": ((real_m, gate_up_dim), dmap[w13.c_dtype]),
            "quanted_down_input": ((real_m, inter), dmap[w2.a_dtype]),
            "down_output": (out_shape if self.is_batched() else (real_m, K), dmap[w13.c_dtype]),
            "output": (out_shape, dmap[w13.c_dtype]),
        }
        assert w13.a_dtype.num_bits == 16 and w2.a_dtype.num_bits == 16
        required = ["quanted_gate_up_input", "gate_up_output", "quanted_down_input", "down_output"]
        if not self.is_batched():
            required.append("output")
        sizes = [0, 0]
        for i, name in enumerate(required[::-1]):
            shape, dt = metas[name]
            sizes[i % 2] = max(sizes[i % 2], math.prod(shape) * dt.itemsize)
        ws = [torch.full((s // 2,), float("nan"), dtype=BF16, device=device) for s in sizes]  # poisoned
        bufs = {}
        for i, name in enumerate(required[::-1]):
            shape, dt = metas[name]
            bufs[name] = ws[i % 2].view(dt).flatten()[: math.prod(shape)].view(*shape)
        # make_workspaces: the modular kernel's output is carved from workspace1 as well
        bufs["output"] = ws[0].flatten()[: math.prod(out_shape)].view(*out_shape)
        return bufs, ws

    # ---- apply of each experts class
    def apply(self, hidden_states, topk_weights, topk_ids, expert_map=None, *, use_scatter=False,
              expert_num_tokens=None):
        self.locks = torch.zeros(132 * 8, dtype=torch.int32, device=hidden_states.device)
        if self.gemm_type.value == "indexed":
            return self._apply_indexed(hidden_states, topk_weights, topk_ids, expert_map, use_scatter)
        if self.gemm_type.value == "grouped_contiguous":
            return self._apply_grouped(hidden_states, topk_weights, topk_ids, expert_map)
        return self._apply_batched(hidden_states, topk_ids, expert_num_tokens)

    def _apply_indexed(self, hidden_states, topk_weights, topk_ids, expert_map, use_scatter):
        from chord.routing import align_block_size

        M, topk = topk_ids.shape
        bufs, _ = self.buffers(M, topk, hidden_states.device)
        valid_shape_m = self.estimate_local_valid_shape_m(topk_ids)
        moe_block_size = None
        for lo, hi, config in self.w13_tuning_config:
            if valid_shape_m > lo and valid_shape_m <= hi:
                moe_block_size = config["block_shape"][0]
                break
        assert moe_block_size is not None, "rows must cover every valid_shape_m"
        use_scatter = use_scatter and expert_map is not None
        r1 = vllm_moe_align_block_size(topk_ids, moe_block_size, self.global_num_experts, expert_map)
        scatter_idx = vllm_scatter_idx(topk_ids, expert_map) if use_scatter else None
        common = {"compute_config": self.compute_config_str, "valid_shape_m": valid_shape_m}
        kw1 = {"top_k": topk, "tuning_config": self.w13_tuning_config_str, "sorted_ids": r1.sorted_ids,
               "expert_ids": r1.expert_ids, "num_tokens_padded": r1.num_tokens_post_padded, **common}
        kw2 = {"top_k": 1, "tuning_config": self.w2_tuning_config_str, "sorted_ids": r1.sorted_ids,
               "expert_ids": r1.expert_ids, "num_tokens_padded": r1.num_tokens_post_padded, **common}
        w2_block_size = 64
        for lo, hi, config in self.w2_tuning_config:
            if lo < valid_shape_m <= hi:
                w2_block_size = config["block_shape"][0]
                break
        if w2_block_size != moe_block_size:
            r2 = vllm_moe_align_block_size(topk_ids, w2_block_size, self.global_num_experts, expert_map)
            kw2.update(sorted_ids=r2.sorted_ids, expert_ids=r2.expert_ids, num_tokens_padded=r2.num_tokens_post_padded)
        self.used_block_sizes = (moe_block_size, w2_block_size)

        inputs, s1, s2 = self.process_input("w13", hidden_states, bufs["quanted_gate_up_input"])
        assert inputs is hidden_states  # nothing to process for bf16 W4A16
        self.humming_forward("w13", inputs, s1, bufs["gate_up_output"], s2, **kw1)
        inputs, s1, s2 = self.process_input("w2", bufs["gate_up_output"], bufs["quanted_down_input"],
                                            activation=SILU_ACTIVATION, scatter_idx=scatter_idx)
        K = hidden_states.size(-1)
        self.humming_forward("w2", inputs, s1, bufs["down_output"].view(-1, K), s2, **kw2)
        return vllm_moe_fused_mul_sum(bufs["down_output"].view(M, topk, -1), topk_weights, topk_ids, expert_map,
                                      bufs["output"])

    def _apply_grouped(self, hidden_states, topk_weights, topk_ids, expert_map):
        M, topk = topk_ids.shape
        valid_shape_m = self.estimate_local_valid_shape_m(topk_ids)
        bufs, _ = self.buffers(M, topk, hidden_states.device)
        expert_offsets, scatter_idx = vllm_moe_prepare_scatter(topk_ids, expert_map, self.num_experts)
        inv_perm = scatter_idx.flatten()
        num_valid_tokens = expert_offsets[-1:]
        inputs, s1, s2 = self.process_input("w13", hidden_states, bufs["quanted_gate_up_input"],
                                            scatter_idx=scatter_idx, num_valid_tokens=num_valid_tokens)
        self.humming_forward("w13", inputs, s1, bufs["gate_up_output"], s2, valid_shape_m=valid_shape_m,
                             expert_layout=expert_offsets, compute_config=self.compute_config_str,
                             tuning_config=self.w13_tuning_config_str)
        inputs, s1, s2 = self.process_input("w2", bufs["gate_up_output"], bufs["quanted_down_input"],
                                            activation=SILU_ACTIVATION, num_valid_tokens=expert_offsets[-1:])
        self.humming_forward("w2", inputs, s1, bufs["down_output"], s2, valid_shape_m=valid_shape_m,
                             expert_layout=expert_offsets, compute_config=self.compute_config_str,
                             tuning_config=self.w2_tuning_config_str)
        return vllm_moe_unpermute(bufs["output"], bufs["down_output"].view(M, topk, -1), topk_weights, inv_perm,
                                  expert_offsets)

    def _apply_batched(self, hidden_states, topk_ids, expert_num_tokens):
        hidden = hidden_states.view(-1, hidden_states.size(-1))
        valid_shape_m = self.estimate_local_valid_shape_m(topk_ids)
        M, topk = topk_ids.shape
        bufs, _ = self.buffers(M, topk, hidden.device)
        bufs["down_output"] = bufs["output"]
        inputs, s1, s2 = self.process_input("w13", hidden, bufs["quanted_gate_up_input"],
                                            expert_tokens=expert_num_tokens)
        assert inputs is hidden
        self.humming_forward("w13", inputs, s1, bufs["gate_up_output"], s2, valid_shape_m=valid_shape_m,
                             expert_layout=expert_num_tokens, compute_config=self.compute_config_str,
                             tuning_config=self.w13_tuning_config_str)
        inputs, s1, s2 = self.process_input("w2", bufs["gate_up_output"], bufs["quanted_down_input"],
                                            expert_tokens=expert_num_tokens, activation=SILU_ACTIVATION)
        out = bufs["output"]
        self.humming_forward("w2", inputs, s1, out.view(-1, hidden.size(-1)), s2, valid_shape_m=valid_shape_m,
                             expert_layout=expert_num_tokens, compute_config=self.compute_config_str,
                             tuning_config=self.w2_tuning_config_str)
        return out  # [E, max_tokens, K]; the batched prepare/finalize does the weighted combine


# --- vLLM's routing helpers (contracts as documented in its code)

def vllm_moe_align_block_size(topk_ids, block_size, num_experts, expert_map):
    """moe_align_block_size(topk_ids, block_size, num_experts, expert_map, ignore_invalid_experts=True)."""
    from chord.routing import align_block_size

    return align_block_size(topk_ids, block_size, num_experts, expert_map, ignore_invalid_experts=True)


def vllm_scatter_idx(topk_ids, expert_map):
    """return_scatter_idx=True: [numel, 1] int32, the routed row index for valid routes, -1 otherwise."""
    flat = topk_ids.reshape(-1).long()
    local = expert_map[flat] if expert_map is not None else flat
    idx = torch.arange(flat.numel(), device=flat.device)
    return torch.where(local >= 0, idx, -1).to(torch.int32).view(-1, 1)


def vllm_moe_prepare_scatter(topk_ids, expert_map, num_local):
    """moe_prepare_scatter: (expert offsets int64 [E+1], destination row of each route int32 [M, topk]);
    routes to non-local experts land past expert_offsets[-1]."""
    M, topk = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    local = expert_map[flat].long() if expert_map is not None else flat
    key = torch.where(local >= 0, local, num_local)
    order = torch.argsort(key, stable=True)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=order.device)
    counts = torch.bincount(key, minlength=num_local + 1)[:num_local]
    offsets = torch.zeros(num_local + 1, dtype=torch.int64, device=flat.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return offsets, inv.view(M, topk).to(torch.int32)


def vllm_moe_fused_mul_sum(inputs, topk_weights, topk_ids, expert_map, outputs):
    valid = torch.ones_like(topk_ids, dtype=torch.bool) if expert_map is None else expert_map[topk_ids.long()] >= 0
    w = torch.where(valid, topk_weights.float(), 0.0).unsqueeze(-1)
    outputs.copy_(torch.where(valid.unsqueeze(-1), inputs.float() * w, 0.0).sum(1))
    return outputs


def vllm_moe_unpermute(out, permuted, topk_weights, inv_perm, expert_offsets):
    M, topk = topk_weights.shape
    flat = permuted.reshape(M * topk, -1)
    rows = inv_perm.long().view(M, topk)
    valid = rows < expert_offsets[-1]
    gathered = flat[rows.clamp(max=flat.shape[0] - 1)].float()
    w = torch.where(valid, topk_weights.float(), 0.0).unsqueeze(-1)
    out.copy_(torch.where(valid.unsqueeze(-1), gathered * w, 0.0).sum(1))
    return out


# --------------------------------------------------------------------------------------------
# the scenarios


def _routing(M, top_k, num_global, seed=7):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(num_global, generator=g)[:top_k] for _ in range(M)]).to(torch.int32)
    weights = torch.rand(M, top_k, generator=g)
    return ids, weights / weights.sum(-1, keepdim=True)


def _expert_map(num_global, num_local, device):
    # this rank owns every other expert (a non-contiguous slice, so global != local ids)
    em = torch.full((num_global,), -1, dtype=torch.int32)
    owned = torch.arange(0, num_global, num_global // num_local)[:num_local]
    em[owned] = torch.arange(num_local, dtype=torch.int32)
    return em.to(device)


def _rel_err(out, ref):
    out, ref = out.float(), ref.float()
    assert torch.isfinite(out).all(), "NaN/inf in the output (a poisoned buffer was read or never written)"
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def run_scenario(device, *, family, num_local, num_global, hidden, inter, M, top_k, group_size=32, entry="moe-backend",
                 use_scatter=False, ctx=contextlib.nullcontext):
    from chord.reference import moe_ref
    from chord.routing import masked_layout, unpermute_masked

    ckpt = make_checkpoint(num_local, hidden, inter, group_size, device)
    params, configs = vllm_load(ckpt, entry=entry, num_experts=num_local, hidden=hidden, inter=inter, device=device)
    ids, weights = _routing(M, top_k, num_global)
    ids, weights = ids.to(device), weights.to(device)
    expert_map = _expert_map(num_global, num_local, device) if num_global != num_local else None
    x = (torch.randn(M, hidden, generator=torch.Generator().manual_seed(3)) * 0.5).to(BF16).to(device)
    ref = moe_ref(x, ckpt["w13"]["exact"], ckpt["w2"]["exact"], weights, ids, expert_map, bf16_intermediates=True)

    if family == "grouped_masked":
        lay = masked_layout(x, ids, num_global, expert_map=expert_map)
        max_tokens = lay.max_rows + 3  # over-allocated batch; rows past the counts are garbage
        xb = torch.full((num_local, max_tokens, hidden), float("nan"), dtype=BF16, device=device)
        for e in range(num_local):
            c = int(lay.expert_num_tokens[e])
            xb[e, :c] = lay.x[e, :c]
        experts = VllmExperts(family, params, configs, global_num_experts=num_global, max_num_tokens=max_tokens)
        with ctx():
            out = experts.apply(xb, weights, ids, expert_map, expert_num_tokens=lay.expert_num_tokens)
        from chord.routing import MaskedLayout

        slots = torch.full((num_local, max_tokens), -1, dtype=torch.int64, device=device)
        slots[:, : lay.max_rows] = lay.src_slot
        y = unpermute_masked(out, MaskedLayout(xb, lay.expert_num_tokens, slots), weights, M)
    else:
        experts = VllmExperts(family, params, configs, global_num_experts=num_global)
        with ctx():
            y = experts.apply(x, weights, ids, expert_map, use_scatter=use_scatter)
    return _rel_err(y, ref), experts, configs


CPU_CASES = {
    # name: (family, num_local, num_global, hidden, inter, M, top_k, group, entry, use_scatter)
    "indexed-ep": ("indexed", 8, 16, 256, 128, 24, 4, 32, "moe-backend", False),
    "indexed-ep-scatter": ("indexed", 8, 16, 256, 128, 24, 4, 32, "moe-backend", True),
    "indexed-tp-quantization-humming": ("indexed", 8, 8, 256, 64, 40, 4, 32, "quantization-humming", False),
    "indexed-padded-g128": ("indexed", 4, 4, 384, 128, 9, 2, 128, "moe-backend", False),
    "indexed-padded-channel": ("indexed", 4, 8, 320, 96, 9, 2, None, "moe-backend", False),
    "grouped-contiguous-ep": ("grouped_contiguous", 8, 16, 256, 128, 24, 4, 32, "moe-backend", False),
    "grouped-contiguous-padded": ("grouped_contiguous", 4, 4, 320, 96, 7, 2, 32, "moe-backend", False),
    "grouped-masked-ep": ("grouped_masked", 8, 16, 256, 128, 24, 4, 32, "moe-backend", False),
    "grouped-masked-padded": ("grouped_masked", 4, 4, 320, 96, 7, 2, 32, "quantization-humming", False),
}


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU variant; the GPU variant below runs the kernels")
@pytest.mark.parametrize("case", sorted(CPU_CASES))
def test_vllm_sequence_cpu_reference_backend(case):
    """CPU: every humming call is real; only the three GEMMs run on chord.reference (no CUDA device here)."""
    family, e_local, e_global, hidden, inter, M, top_k, group, entry, scatter = CPU_CASES[case]
    err, experts, configs = run_scenario(
        "cpu", family=family, num_local=e_local, num_global=e_global, hidden=hidden, inter=inter, M=M, top_k=top_k,
        group_size=group, entry=entry, use_scatter=scatter, ctx=_chord.cpu_reference_backend)
    assert err < 1e-2, f"{case}: relative error {err:.3g} vs chord.reference.moe_ref"
    if hidden % 128:  # vLLM padded K of w13 (and N of w2) to 128/256
        assert configs["w13"].pad_shape_k > 0 and configs["w2"].pad_shape_n > 0


def test_indexed_block_sizes_follow_chord_schedule():
    """The moe_align block size vLLM reads from the w13 row is chord.schedule's block_m for that M."""
    from humming.config import GemmType, LayerConfig
    from humming.tune import get_heuristics_config

    cfg = LayerConfig(shape_n=4096, shape_k=7168, num_experts=48)
    rows = get_heuristics_config(layer_config=cfg, gemm_type=GemmType.INDEXED)
    assert rows[0][0] < 0 and rows[-1][1] >= 2**31 - 1
    assert all(a[1] == b[0] for a, b in zip(rows, rows[1:])), "rows must tile the M axis"
    for m in (1, 48, 48 * 8, 48 * 9, 48 * 16, 48 * 17, 48 * 32, 48 * 33, 48 * 512, 10**7):
        cfg_m = next(c for lo, hi, c in rows if lo < m <= hi)
        sched = _chord.select_schedule("indexed", 48, 4096, 7168, m)
        assert cfg_m["block_shape"][0] == sched.block_m and cfg_m["schedule"] == sched.id, m
    assert json.loads(json.dumps(rows)) == [list(r) for r in rows]  # vLLM json.dumps the rows


# --------------------------------------------------------------------------------------------
# GPU: the same sequence on Chord's kernels (H200)

GPU_CASES = {
    # small shapes: every family, expert_map, scatter, padding, group expansion
    **{k: v for k, v in CPU_CASES.items()},
    # Kimi K2.x per-GPU shapes (EP8: 48 of 384 experts; TP8: 384 experts, I/8 = 256)
    "kimi-ep8-indexed": ("indexed", 48, 384, 7168, 2048, 64, 8, 32, "moe-backend", True),
    "kimi-ep8-grouped-contiguous": ("grouped_contiguous", 48, 384, 7168, 2048, 256, 8, 32, "moe-backend", False),
    "kimi-ep8-grouped-masked": ("grouped_masked", 48, 384, 7168, 2048, 16, 8, 32, "moe-backend", False),
    "kimi-tp8-indexed": ("indexed", 384, 384, 7168, 256, 96, 8, 32, "quantization-humming", False),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_vllm_sequence_gpu_kernels(case):
    family, e_local, e_global, hidden, inter, M, top_k, group, entry, scatter = GPU_CASES[case]
    err, experts, _ = run_scenario("cuda", family=family, num_local=e_local, num_global=e_global, hidden=hidden,
                                   inter=inter, M=M, top_k=top_k, group_size=group, entry=entry, use_scatter=scatter)
    torch.cuda.synchronize()
    assert err < 1e-2, f"{case}: relative error {err:.3g} vs chord.reference.moe_ref"


@pytest.mark.gpu
@pytest.mark.parametrize("case, planned", [("kimi-tp8-indexed", True), ("indexed-ep", True),
                                           ("grouped-contiguous-ep", True), ("grouped-masked-ep", True),
                                           ("grouped-contiguous-padded", False), ("indexed-padded-channel", False)])
def test_repeated_forwards_launch_through_chord_plans(case, planned, monkeypatch):
    """humming_forward's eager fast path (humming.forward._launched): the second forward of the
    same shapes (new weights, inputs and buffers) launches through chord's launch plans without
    humming's Python path, with the same output bits; inputs humming pads (K, N of a padded
    layer) never match a plan and keep taking the Python path, correct."""
    from chord import launch
    from humming import forward

    family, e_local, e_global, hidden, inter, M, top_k, group, entry, scatter = GPU_CASES[case]
    args = dict(family=family, num_local=e_local, num_global=e_global, hidden=hidden, inter=inter, M=M, top_k=top_k,
                group_size=group, entry=entry, use_scatter=scatter)
    launch.fast_launch(True)
    launch.clear()
    python_path, real = [], forward._gemm
    monkeypatch.setattr(forward, "_gemm", lambda *a, **k: python_path.append(1) or real(*a, **k))
    err1, _, _ = run_scenario("cuda", **args)
    assert len(python_path) == 2  # gate_up and down: the first calls make the plans
    err2, _, _ = run_scenario("cuda", **args)
    torch.cuda.synchronize()
    assert len(python_path) == (2 if planned else 4), case
    assert err1 < 1e-2 and err2 == err1, (case, err1, err2)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["indexed", "grouped_contiguous"])
def test_batch_invariant_mode_rows_do_not_depend_on_their_batch(family):
    """VLLM_BATCH_INVARIANT=1 through the humming root: a token's MoE output has the same bits
    alone, in a small batch, in a large one and in a permuted batch (one schedule per layer, no
    split-K), and matches the reference."""
    from chord.reference import moe_ref
    from chord.testing import same_bits

    device, e, hidden, inter, top_k, M = "cuda", 16, 1024, 256, 4, 300
    ckpt = make_checkpoint(e, hidden, inter, 32, device)
    params, configs = vllm_load(ckpt, entry="moe-backend", num_experts=e, hidden=hidden, inter=inter, device=device)
    experts = VllmExperts(family, params, configs, global_num_experts=e, batch_invariant=True)
    ids, weights = _routing(M, top_k, e, seed=11)
    ids, weights = ids.to(device), weights.to(device)
    x = (torch.randn(M, hidden, generator=torch.Generator().manual_seed(5)) * 0.5).to(BF16).to(device)
    full = experts.apply(x, weights, ids, None)
    ref = moe_ref(x, ckpt["w13"]["exact"], ckpt["w2"]["exact"], weights, ids, None, bf16_intermediates=True)
    assert _rel_err(full, ref) < 1e-2
    for idx in ([0], [5, 17, 299], list(range(1, 64)), list(range(M - 1, -1, -1)), list(range(0, M, 3))):
        sub = experts.apply(x[idx], weights[idx], ids[idx], None)
        torch.cuda.synchronize()
        assert same_bits(sub, full[idx]), f"{family}: rows {idx[:4]}... changed bits in a batch of {len(idx)}"


@pytest.mark.gpu
def test_indexed_forward_under_torch_compile_and_cuda_graph():
    """humming_forward + may_process_input compile with fullgraph=True and replay in a CUDA graph."""
    from chord.reference import moe_ref
    from humming.forward import humming_forward, may_process_input

    device = "cuda"
    E, H, I, M, top_k = 8, 256, 128, 32, 4
    ckpt = make_checkpoint(E, H, I, 32, device)
    params, configs = vllm_load(ckpt, entry="moe-backend", num_experts=E, hidden=H, inter=I, device=device)
    experts = VllmExperts("indexed", params, configs, global_num_experts=E)
    ids, weights = (t.to(device) for t in _routing(M, top_k, E))
    x = (torch.randn(M, H, device=device) * 0.5).to(BF16)
    v = M * top_k
    bm = next(c["block_shape"][0] for lo, hi, c in experts.w13_tuning_config if lo < v <= hi)
    r = vllm_moe_align_block_size(ids, bm, E, None)
    # over-allocated routing buffers, as under CUDA graphs
    sorted_ids = torch.full((r.sorted_ids.numel() + 4 * bm,), v, dtype=torch.int32, device=device)
    sorted_ids[: r.sorted_ids.numel()] = r.sorted_ids
    expert_ids = torch.full((sorted_ids.numel() // bm,), -1, dtype=torch.int32, device=device)
    expert_ids[: r.expert_ids.numel()] = r.expert_ids
    g = torch.empty(v, 2 * I, dtype=BF16, device=device)
    a = torch.empty(v, I, dtype=BF16, device=device)
    d = torch.empty(v, H, dtype=BF16, device=device)

    def layer(x, sorted_ids, expert_ids, ntp):
        humming_forward(configs["w13"], x, params["w13_weight"], params["w13_weight_scale"], outputs=g,
                        sorted_ids=sorted_ids, expert_ids=expert_ids, num_tokens_padded=ntp, top_k=top_k,
                        valid_shape_m=v, compute_config=experts.compute_config_str,
                        tuning_config=experts.w13_tuning_config_str)
        act, _, _ = may_process_input(configs["w2"], g, outputs=a, layout="normal", **SILU_ACTIVATION)
        humming_forward(configs["w2"], act, params["w2_weight"], params["w2_weight_scale"], outputs=d,
                        sorted_ids=sorted_ids, expert_ids=expert_ids, num_tokens_padded=ntp, top_k=1,
                        valid_shape_m=v, compute_config=experts.compute_config_str,
                        tuning_config=experts.w2_tuning_config_str)
        return d

    ref = moe_ref(x, ckpt["w13"]["exact"], ckpt["w2"]["exact"], weights, ids, bf16_intermediates=True)
    compiled = torch.compile(layer, fullgraph=True)
    out = compiled(x, sorted_ids, expert_ids, r.num_tokens_post_padded)
    y = (out.float().view(M, top_k, H) * weights.unsqueeze(-1)).sum(1)
    assert _rel_err(y, ref) < 1e-2

    d.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    layer(x, sorted_ids, expert_ids, r.num_tokens_post_padded)  # warm up (compiles kernels)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        layer(x, sorted_ids, expert_ids, r.num_tokens_post_padded)
    d.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    y = (d.float().view(M, top_k, H) * weights.unsqueeze(-1)).sum(1)
    assert _rel_err(y, ref) < 1e-2


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU variant; the GPU test above compiles the real kernels")
@pytest.mark.parametrize("case", ["indexed-ep-scatter", "grouped-contiguous-padded", "grouped-masked-ep"])
def test_vllm_sequence_traces_with_fullgraph_torch_compile_cpu(case, monkeypatch, request):
    """Every humming call of vLLM's sequence compiles with torch.compile(fullgraph=True): no graph break.

    No GPU here, so the chord ops' bodies are pointed at chord.reference (chord.ops' private
    ``_gemm_*_impl`` hooks: if chord.ops renames them, update this test) while their fake
    implementations trace, and humming's device check is bypassed so the op path is traced.
    """
    import chord.ops as chord_ops
    import humming.forward as hf
    from humming import _reference

    monkeypatch.setattr(chord_ops, "_gemm_indexed_impl",
                        lambda x, qw, sc, si, ei, ntp, out, top_k, bm, s, check=None, all_routes=False: _reference.gemm_indexed(
                            x, qw, sc, si, ei, ntp, out, top_k, bm))
    monkeypatch.setattr(chord_ops, "_gemm_contiguous_impl",
                        lambda x, qw, sc, off, out, s, check=None: _reference.gemm_contiguous(x, qw, sc, off, out))
    monkeypatch.setattr(chord_ops, "_gemm_masked_impl",
                        lambda x, qw, sc, cnt, out, s, check=None: _reference.gemm_masked(x, qw, sc, cnt, out))
    monkeypatch.setattr(_chord, "_use_reference", lambda x: False)
    # torch's config patcher, not monkeypatch: newer pytest deletes attributes it did not find in
    # the module __dict__ on undo, which removes dynamo's config entries for later tests.
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    patcher = torch._dynamo.config.patch({limit: 64})
    patcher.__enter__()
    request.addfinalizer(lambda: patcher.__exit__(None, None, None))
    torch._dynamo.reset()
    monkeypatch.setattr(hf, "humming_forward", torch.compile(hf.humming_forward, fullgraph=True))
    monkeypatch.setattr(hf, "may_process_input", torch.compile(hf.may_process_input, fullgraph=True))
    family, e_local, e_global, hidden, inter, M, top_k, group, entry, scatter = CPU_CASES[case]
    err, _, _ = run_scenario("cpu", family=family, num_local=e_local, num_global=e_global, hidden=hidden,
                             inter=inter, M=M, top_k=top_k, group_size=group, entry=entry, use_scatter=scatter)
    torch._dynamo.reset()
    assert err < 1e-2, f"{case}: relative error {err:.3g} under torch.compile"


def test_layer_tensor_check_traces_without_a_data_pointer_key():
    """humming.forward.check_layer_tensors under torch.compile(fullgraph=True) with tensors that
    have memory: it checks the shapes while tracing and keys no memo on a data pointer (Dynamo
    cannot hash one: on the H200 the compiled forward broke there). A wrong layer still raises."""
    import humming.forward as hf
    from humming.config import LayerConfig

    cfg = LayerConfig(shape_n=256, shape_k=512, num_experts=4)
    w = torch.zeros(4, 2, 8, 8, 32, 4, dtype=torch.int32)
    s = torch.zeros(4, 2, 8, 8, 8, 2, 2, dtype=torch.bfloat16)
    torch._dynamo.reset()
    check = torch.compile(lambda w, s: (hf.check_layer_tensors(cfg, w, s), w.sum())[1], fullgraph=True)
    before = dict(hf._LAYERS_CHECKED)
    assert int(check(w, s)) == 0
    assert hf._LAYERS_CHECKED == before  # nothing memoized while compiled
    with pytest.raises(Exception, match="weight must be this layer's"):
        check(torch.zeros(3, 2, 8, 8, 32, 4, dtype=torch.int32), torch.zeros(3, 2, 8, 8, 8, 2, 2, dtype=torch.bfloat16))
    torch._dynamo.reset()

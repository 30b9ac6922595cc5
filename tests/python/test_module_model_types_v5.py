"""Model types against transformers v5 itself (an outside oracle; the device machine has it,
elsewhere this test is SKIPPED): for each MoE model type, a tiny model built by transformers with
random weights (and a random e_score_correction_bias where it has one) is saved in bf16, and
`tilemoe forward --tokens` on each MoE layer must either
- route as the model's own MoE block does (the same experts, weights within 1e-5) and give its
  experts module's output on those experts within 1e-2, or
- refuse with an error that names the model type: routers tilemoe does not compute, and layouts
  it does not read.
A type accepted and routed differently is the failure this test exists for. Beside the types
listed, every other model type of the installed transformers whose config speaks of experts is
tried too (when transformers can build a tiny one): each must be routed as transformers routes it
or refused, so a type added to transformers cannot be routed wrongly unseen.

Usage: test_module_model_types_v5.py <tests/data> <cmake> <build dir>. Exits 77 (SKIPPED) without torch or transformers >= 5.
"""
import inspect
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np  # noqa: F401  (tilemoe needs it)
    import torch
    import transformers
except ImportError as e:
    print(f"{e}: transformers v5 is not installed here: skipped")
    sys.exit(77)
if int(transformers.__version__.split(".")[0]) < 5:
    print(f"transformers {transformers.__version__}: this test needs v5's model types: skipped")
    sys.exit(77)

from tilemoe import safetensors_io
from checks import expect, rel, finish

CLI = os.path.join(sys.argv[3], "tilemoe")
E, K, H = 5, 2, 72
# Routed as transformers does.
ROUTED = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "dots1", "ernie4_5_moe", "glm4_moe", "glm4_moe_lite", "exaone_moe",
          "flex_olmo", "granitemoe", "granitemoeshared", "hunyuan_v1_moe", "minimax", "minimax_m2", "mixtral", "olmoe", "qwen2_moe",
          "qwen3_moe", "qwen3_next", "glm_moe_dsa", "solar_open", "mimo_v2_flash", "qwen3_5_moe_text", "mellum",
          "qwen4_exp_text", "hy_v3", "afmoe", "kimi_linear", "deepseek_v4", "gpt_oss")
# Read, but routing by the router refused (the experts run with ids given to them).
ROUTING_REFUSED = ("phimoe",)
# Refused when read: a layout or a config tilemoe does not know.
REFUSED = ("jetmoe", "longcat_flash", "minimax_m3_vl_text")
LISTED = ROUTED + ROUTING_REFUSED + REFUSED
WANTED = dict(vocab_size=64, hidden_size=H, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=36,
              max_position_embeddings=64, tie_word_embeddings=False, intermediate_size=96, moe_intermediate_size=40,
              num_experts=E, num_local_experts=E, n_routed_experts=E, moe_num_experts=E, num_experts_per_tok=K, moe_k=K,
              first_k_dense_replace=1, n_group=1, topk_group=1, n_shared_experts=1, shared_expert_intermediate_size=48,
              q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, decoder_sparse_step=1,
              mlp_only_layers=[], moe_topk=K, use_cache=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
# Fields of one type: DeepSeek-V4 with a hash-routed layer (whose routing tilemoe refuses: it needs
# token ids) and a routed one, and a swiglu_limit low enough that these weights' gates and ups meet it.
EXTRA = {"deepseek_v4": dict(mlp_layer_types=["hash_moe", "moe"], swiglu_limit=0.25)}
# gpt-oss's module clamps at a fixed 7 (its SwiGLU, with biases): its gate_up weights scaled up so
# that these inputs meet the clamp.
EXPERT_SCALE = {"gpt_oss": 8.0}



def tiny_model(kind):
    cls = transformers.CONFIG_MAPPING[kind]
    # Only the fields the class has: another family's names would be written into config.json
    # (v5 keeps unknown keys) and make it read as that family's.
    params = inspect.signature(cls.__init__).parameters
    config = cls(**{k: v for k, v in WANTED.items() if k in params}, **EXTRA.get(kind, {}))
    torch.manual_seed(7)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((torch.randn(p.shape) / max(p.shape[-1], 1) ** 0.5).to(torch.bfloat16).float())
        for n, b in list(model.named_buffers()) + list(model.named_parameters()):
            if n.endswith("e_score_correction_bias") or n.endswith("expert_bias"):
                b.copy_((torch.randn(b.shape) * 0.3).to(torch.bfloat16).float())
            if kind in EXPERT_SCALE and n.endswith("experts.gate_up_proj"):
                b.copy_((b * EXPERT_SCALE[kind]).to(torch.bfloat16).float())
    return config, model


def forward_cli(model_dir, layer, out):
    return subprocess.run([CLI, "forward", "--model", model_dir, "--layer", str(layer), "--tokens", "17", "--seed", "3", "--output", out],
                          capture_output=True, text=True)


def check_routed(kind, model_dir, model, tmp):
    layers = 0
    for layer in range(model.config.num_hidden_layers):
        found = [(n, m) for n, m in model.named_modules() if f".layers.{layer}." in n and n.endswith(".experts")]
        if not found:
            continue
        layers += 1
        name, experts = found[0]
        where = f"{kind} layer {layer}"
        block = model.get_submodule(name.rsplit(".", 1)[0])
        out = os.path.join(tmp, f"{kind}_{layer}.safetensors")
        run = forward_cli(model_dir, layer, out)
        if (getattr(model.config, "mlp_layer_types", None) or [None] * (layer + 1))[layer] == "hash_moe":
            print(f"{where}: hash-routed: refused: {run.stderr.strip()}")
            expect(run.returncode != 0 and "token id" in run.stderr, f"{where}: a hash-routed layer was not refused by name: {run.stderr.strip()}")
            continue
        expect(run.returncode == 0, f"{where}: tilemoe forward failed: {run.stderr.strip()}")
        if run.returncode != 0:
            continue
        got = safetensors_io.read_tensors(out)
        x = torch.from_numpy(got["input"]).float()
        seen = {}

        def hook(module, args, kwargs):
            seen["routing"] = (list(args[1:]) + [kwargs.get("top_k_index"), kwargs.get("top_k_weights")])[:2]
        handle = experts.register_forward_pre_hook(hook, with_kwargs=True)
        with torch.no_grad():
            block(x[None])
        handle.remove()
        ids, w = seen["routing"]
        mine_ids, mine_w = torch.from_numpy(got["expert_ids"]), torch.from_numpy(got["weights"])
        order, mine_order = ids.sort(dim=1), mine_ids.sort(dim=1)
        same = torch.equal(order.values, mine_order.values)
        expect(same, f"{where}: tilemoe's router chose other experts than transformers' ({(order.values != mine_order.values).any(1).sum()} "
                     f"of {ids.shape[0]} tokens)")
        if not same:
            continue
        err_w = rel(mine_w.gather(1, mine_order.indices), w.float().gather(1, order.indices))
        with torch.no_grad():
            want = experts(x, ids, w.float())
            if getattr(experts, "limit", None) is not None:
                # The clamp must be met here, or this checks nothing of it.
                limit, experts.limit = experts.limit, float("inf")
                unclamped = experts(x, ids, w.float())
                experts.limit = limit
                expect(rel(unclamped, want) > 0.05, f"{where}: swiglu_limit {limit} changes nothing here ({rel(unclamped, want):.2e})")
        err_out = rel(torch.from_numpy(got["output"]), want)
        print(f"{where}: the same experts, weights {err_w:.2e}, output {err_out:.2e} ({type(block).__name__})")
        expect(err_w <= 1e-5, f"{where}: routing weights differ from transformers' by {err_w:.2e}")
        expect(err_out <= 1e-2, f"{where}: output differs from the experts module's by {err_out:.2e}")
    expect(layers > 0, f"{kind}: no MoE layer found in transformers' model")


def check_refused(kind, model_dir, model, tmp, routing_only):
    run = forward_cli(model_dir, model.config.num_hidden_layers - 1, os.path.join(tmp, f"{kind}.safetensors"))
    message = run.stderr.strip()
    print(f"{kind}: refused: {message}")
    expect(run.returncode != 0, f"{kind}: tilemoe forward --tokens ran on a model type it should refuse")
    if routing_only:
        expect(f"model_type '{kind}'" in message and "router" in message, f"{kind}: the refusal does not name the type's router: {message}")
    else:
        expect(message.startswith("tilemoe: error:") and len(message) > 40, f"{kind}: no clear error: {message}")


def speaks_of_experts(kind):
    try:
        params = inspect.signature(transformers.CONFIG_MAPPING[kind].__init__).parameters
    except Exception:
        return False
    return any("expert" in p or p.startswith("moe_") for p in params)


def has_experts(model):
    return any(".layers." in n and n.endswith(".experts") for n, _ in model.named_modules())


def check_unlisted(kind, model_dir, model, tmp):
    """A type this test does not list: tilemoe either refuses it clearly or routes it as transformers does."""
    last = model.config.num_hidden_layers - 1
    run = forward_cli(model_dir, last, os.path.join(tmp, f"{kind}_probe.safetensors"))
    if run.returncode != 0:
        message = run.stderr.strip()
        print(f"{kind} (not listed): refused: {message[:200]}")
        expect(message.startswith("tilemoe: error:") and len(message) > 40, f"{kind}: no clear error: {message}")
        return
    print(f"{kind} (not listed): tilemoe routes it; checking it against transformers")
    check_routed(kind, model_dir, model, tmp)


unlisted = sorted(k for k in transformers.CONFIG_MAPPING.keys() if k not in LISTED and speaks_of_experts(k))
with tempfile.TemporaryDirectory() as tmp:
    for kind in LISTED + tuple(unlisted):
        try:
            try:
                config, model = tiny_model(kind)
            except Exception as e:
                if kind in LISTED:
                    raise
                print(f"{kind} (not listed): transformers builds no tiny causal LM of it here ({type(e).__name__}): not tried")
                continue
            if kind not in LISTED and not has_experts(model):
                print(f"{kind} (not listed): no '.experts' module in its layers: not tried")
                continue
            model_dir = os.path.join(tmp, kind)
            model.to(torch.bfloat16).save_pretrained(model_dir, safe_serialization=True)
            model.float()
            if kind in ROUTED:
                check_routed(kind, model_dir, model, tmp)
            elif kind in LISTED:
                check_refused(kind, model_dir, model, tmp, routing_only=kind in ROUTING_REFUSED)
            else:
                check_unlisted(kind, model_dir, model, tmp)
        except Exception as e:  # a failure of this test, named, not a crash of the others
            import traceback
            traceback.print_exc()
            expect(False, f"{kind}: {type(e).__name__}: {e}")

finish("every model type is routed as transformers routes it, or refused by name")

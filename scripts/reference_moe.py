"""Independent float64 reference for skein's mixtures of experts (development time only; CI reads the fixture).

A transcription of Hugging Face's sparse MoE blocks, written from the reference notes
(/work/shared/reference/moe-and-quantized-bases.md sections 1.2 and 2.2, qwen35.md section 1.4),
not from skein's Go code:

- qwen3_moe (modeling_qwen3_moe, v4): Qwen3's attention (q/k RMSNorm before RoPE); the block
  routes by softmax over the router logits, top-k of the probabilities, renormalised when
  norm_topk_prob, and loops over the experts that received a token, index_add'ing each expert's
  output times its routing weight (no capacity, no dropping); layers in mlp_only_layers keep the
  dense MLP.
- qwen3_5_moe (modeling_qwen3_5_moe): the Qwen3.5 hybrid stack of scripts/reference_qwen35.py with
  that block on every layer, always renormalised, plus the shared expert scaled by
  sigmoid(shared_expert_gate(x)).

The adapter is Tinker's MoE layout (w1 = gate, w3 = up, w2 = down; A of w1/w3 [1, r, D] and B
[E, I, r]; A of w2 [E, r, I] and B [1, D, r]) applied the way the cookbook's weights/ module
expands it for PEFT and vLLM: expert e's gate_proj gets LoRA (A = w1.A[0], B = w1.B[e]), its
down_proj (A = w2.A[e], B = w2.B[0]), i.e. a per-expert delta B_e·A_e on each expert's own
weight, rather than skein's mixing of rank-r rows before a shared B.

torch.topk's order among equal probabilities is unspecified; this script takes the lower expert
first, as skein does (the generated models have no exact ties).

  SKEIN_REFERENCE_INPUTS=/tmp/moe go test ./engine -run TestWriteMoEReferenceInputs
  /usr/bin/python3 scripts/reference_moe.py /tmp/moe engine/testdata/reference_moe.json
"""
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
import reference_qwen35 as q35  # noqa: E402

torch.set_default_dtype(torch.float64)


def topk_lower_first(p, k):
    """The k largest entries of each row in decreasing order, ties to the lower index."""
    order = torch.argsort(-p, dim=-1, stable=True)[:, :k]
    return torch.gather(p, 1, order), order


def sparse_moe(m, x, W, lin, tc, experts_lora, shared):
    E, k = tc["num_experts"], tc["num_experts_per_tok"]
    norm = tc.get("norm_topk_prob", False) or shared  # Qwen3.5-MoE's router always renormalises
    logits = x @ W[m + "gate.weight"].T
    p = F.softmax(logits, dim=1)
    w, sel = topk_lower_first(p, k)
    if norm:
        w = w / w.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(E):
        tok, slot = torch.where(sel == e)
        if tok.numel() == 0:
            continue
        xe = x[tok]
        ep = f"{m}experts.{e}."
        gate = xe @ W[ep + "gate_proj.weight"].T
        up = xe @ W[ep + "up_proj.weight"].T
        if experts_lora is not None:
            (a1, b1), (a3, b3), (a2, b2), s = experts_lora
            gate = gate + s * (xe @ a1[0].T) @ b1[e].T
            up = up + s * (xe @ a3[0].T) @ b3[e].T
        act = F.silu(gate) * up
        y = act @ W[ep + "down_proj.weight"].T
        if experts_lora is not None:
            y = y + s * (act @ a2[e].T) @ b2[0].T
        out.index_add_(0, tok, y * w[tok, slot, None])
    if shared:
        sh = q35.dense_mlp(m + "shared_expert.", x, W, lin, tc)
        out = out + torch.sigmoid(x @ W[m + "shared_expert_gate.weight"].T) * sh
    return out


def adapter_experts(md, with_adapter):
    """Per MoE prefix "...mlp.": ((A, B) of w1, w3, w2, scale) from the adapter file."""
    if not with_adapter:
        return {}
    ac = json.loads((md / "adapter" / "adapter_config.json").read_text())
    scale = ac["lora_alpha"] / ac["r"]
    aw = q35.load_safetensors(md / "adapter" / "adapter_model.safetensors")
    out = {}
    for key in aw:
        if key.endswith("experts.w1.lora_A.weight"):
            base = key[len("base_model.model."):-len("experts.w1.lora_A.weight")]
            pre = key[:-len("w1.lora_A.weight")]
            out[base] = tuple((aw[pre + n + ".lora_A.weight"], aw[pre + n + ".lora_B.weight"]) for n in ("w1", "w3", "w2")) + (scale,)
    return out


def moe_mlp(md, with_adapter, shared):
    ex = adapter_experts(md, with_adapter)

    def mlp(m, x, W, lin, tc):
        if m + "gate.weight" not in W:
            return q35.dense_mlp(m, x, W, lin, tc)
        # Tinker names the adapter's modules without a VL model's language_model. part.
        key = m.replace("model.language_model.", "model.")
        lo = ex.get(key, ex.get(m))
        assert (lo is not None) == with_adapter, f"{m}: the adapter's experts were not found"
        return sparse_moe(m, x, W, lin, tc, lo, shared)
    return mlp


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def forward_qwen3_moe(md, tokens, with_adapter):
    """Qwen3MoeForCausalLM: Qwen3 attention, the sparse block where the config says."""
    tc = json.loads((md / "config.json").read_text())
    W = q35.load_safetensors(md / "model.safetensors")
    lora = {}
    if with_adapter:
        ac = json.loads((md / "adapter" / "adapter_config.json").read_text())
        scale = ac["lora_alpha"] / ac["r"]
        aw = q35.load_safetensors(md / "adapter" / "adapter_model.safetensors")
        for key, a in aw.items():
            if key.endswith(".lora_A.weight") and ".experts." not in key:
                lora[key[len("base_model.model."):-len(".lora_A.weight")]] = (a, aw[key.replace("lora_A", "lora_B")], scale)

    def lin(path):
        return q35.Lin(W[path + ".weight"], lora.get(path))

    eps = tc["rms_norm_eps"]
    H, KVH, hd = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    T = len(tokens)
    inv_freq = 1.0 / (tc["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos(), emb.sin()

    def rope(x):
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos[:, None, :] + torch.cat([-x2, x1], -1) * sin[:, None, :]

    mlp = moe_mlp(md, with_adapter, shared=False)
    step, only = tc.get("decoder_sparse_step", 1), set(tc.get("mlp_only_layers", []))
    h = W["model.embed_tokens.weight"][torch.tensor(tokens)]
    for l in range(tc["num_hidden_layers"]):
        p = f"model.layers.{l}."
        x = rms(h, W[p + "input_layernorm.weight"], eps)
        s_ = p + "self_attn."
        q = rope(rms(lin(s_ + "q_proj")(x).view(T, H, hd), W[s_ + "q_norm.weight"], eps))
        k = rope(rms(lin(s_ + "k_proj")(x).view(T, KVH, hd), W[s_ + "k_norm.weight"], eps))
        v = lin(s_ + "v_proj")(x).view(T, KVH, hd)
        k, v = k.repeat_interleave(H // KVH, dim=1), v.repeat_interleave(H // KVH, dim=1)
        scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
        scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        att = torch.einsum("hts,shd->thd", torch.softmax(scores, -1), v).reshape(T, H * hd)
        h = h + lin(s_ + "o_proj")(att)
        x = rms(h, W[p + "post_attention_layernorm.weight"], eps)
        sparse = l not in only and tc["num_experts"] > 0 and (l + 1) % step == 0
        assert sparse == (p + "mlp.gate.weight" in W)
        h = h + mlp(p + "mlp.", x, W, lin, tc)
    h = rms(h, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if tc.get("tie_word_embeddings") else W["lm_head.weight"]
    return q35.Lin(head, lora.get("lm_head"))(h)


def main():
    indir, out = Path(sys.argv[1]), sys.argv[2]
    inputs = json.loads((indir / "inputs.json").read_text())
    cases = []
    for c in inputs["cases"]:
        md = indir / c["arch"]
        if c["arch"] == "qwen3_moe":
            logits = forward_qwen3_moe(md, c["tokens"], c["adapter"])
        else:
            logits = q35.forward(md, c["tokens"], c["adapter"], mlp=moe_mlp(md, c["adapter"], shared=True))
        c = dict(c, vocab=logits.shape[1], logits=[float(x) for x in logits.reshape(-1)])
        cases.append(c)
        print(c["arch"], "adapter" if c["adapter"] else "base", "logits", logits.shape, "max |logit|", float(logits.abs().max()))
    Path(out).write_text(json.dumps({"cases": cases}))


if __name__ == "__main__":
    main()

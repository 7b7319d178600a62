"""Independent reference for the engine's forward pass (development time only; CI reads the fixture).

A direct torch transcription of Hugging Face's modeling_llama / modeling_qwen2 / modeling_qwen3
forward (RMSNorm in float32, rotate_half RoPE with llama3 scaling, repeat_kv GQA, SiLU MLP, tied or
untied lm_head) plus PEFT LoRA (y += scale * x A^T B^T). Run with Debian's python3-torch:

  /usr/bin/python3 scripts/reference_logits.py IN_DIR OUT_JSON

IN_DIR holds one model directory per architecture and an `adapter` directory inside each, written by
`SKEIN_REFERENCE_INPUTS=IN_DIR go test ./engine -run TestWriteReferenceInputs`.
"""
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
import torch

torch.set_default_dtype(torch.float64)


def load_safetensors(path):
    b = Path(path).read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    data = b[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        lo, hi = e["data_offsets"]
        dt = {"F32": np.float32, "F64": np.float64}[e["dtype"]]
        out[name] = torch.tensor(np.frombuffer(data[lo:hi], dtype=dt).reshape(e["shape"]).astype(np.float64))
    return out


def inv_freq(cfg, hd):
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rs = cfg.get("rope_scaling")
    if rs and (rs.get("rope_type") or rs.get("type")) == "llama3":
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        orig = rs["original_max_position_embeddings"]
        low_wave, high_wave = orig / low, orig / high
        wave = 2 * math.pi / inv
        scaled = torch.where(wave > low_wave, inv / factor, inv)
        smooth = (orig / wave - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wave >= high_wave) & (wave <= low_wave)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def rms(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(model_dir, tokens, adapter_dir=None):
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    W = load_safetensors(Path(model_dir) / "model.safetensors")
    lora, scale = {}, 0.0
    if adapter_dir:
        acfg = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
        scale = acfg["lora_alpha"] / acfg["r"]
        A = load_safetensors(Path(adapter_dir) / "adapter_model.safetensors")
        for k, v in A.items():
            mod = k[len("base_model.model."):].rsplit(".lora_", 1)[0]
            lora.setdefault(mod, {})["A" if ".lora_A." in k else "B"] = v

    def linear(x, mod, bias=True):
        y = x @ W[mod + ".weight"].T
        if bias and (mod + ".bias") in W:
            y = y + W[mod + ".bias"]
        if mod in lora:
            y = y + scale * (x @ lora[mod]["A"].T) @ lora[mod]["B"].T
        return y

    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg["hidden_size"]
    hd = cfg.get("head_dim") or D // H
    eps = cfg["rms_norm_eps"]
    T = len(tokens)
    pos = torch.arange(T, dtype=torch.float64)
    freqs = torch.outer(pos, inv_freq(cfg, hd))
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    h = W["model.embed_tokens.weight"][torch.tensor(tokens)]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        x = rms(h, W[p + "input_layernorm.weight"], eps)
        q = linear(x, p + "self_attn.q_proj").view(T, H, hd).transpose(0, 1)
        k = linear(x, p + "self_attn.k_proj").view(T, KV, hd).transpose(0, 1)
        v = linear(x, p + "self_attn.v_proj").view(T, KV, hd).transpose(0, 1)
        if cfg["model_type"] == "qwen3":
            q = rms(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms(k, W[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=0)
        v = v.repeat_interleave(H // KV, dim=0)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd) + mask
        o = (att.softmax(-1) @ v).transpose(0, 1).reshape(T, H * hd)
        h = h + linear(o, p + "self_attn.o_proj")
        x = rms(h, W[p + "post_attention_layernorm.weight"], eps)
        g = linear(x, p + "mlp.gate_proj")
        u = linear(x, p + "mlp.up_proj")
        h = h + linear(torch.nn.functional.silu(g) * u, p + "mlp.down_proj")
    h = rms(h, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else W["lm_head.weight"]
    logits = h @ head.T
    if "lm_head" in lora:
        logits = logits + scale * (h @ lora["lm_head"]["A"].T) @ lora["lm_head"]["B"].T
    return logits


def main():
    in_dir, out = Path(sys.argv[1]), sys.argv[2]
    spec = json.loads((in_dir / "inputs.json").read_text())
    cases = []
    for c in spec["cases"]:
        d = in_dir / c["arch"]
        logits = forward(d, c["tokens"], d / "adapter" if c["adapter"] else None)
        cases.append({**c, "logits": [round(float(x), 7) for x in logits.flatten()], "vocab": logits.shape[1]})
    Path(out).write_text(json.dumps({"generator": "scripts/reference_logits.py (torch %s, float64)" % torch.__version__,
                                     "cases": cases}))


if __name__ == "__main__":
    main()

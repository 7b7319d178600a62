"""Independent float64 reference for skein's Qwen3.5 forward pass (development time only; CI reads the fixture).

A transcription of Hugging Face's modeling_qwen3_5 text stack (Qwen3_5GatedDeltaNet, Qwen3_5Attention,
Qwen3_5RMSNorm / Qwen3_5RMSNormGated, partial rotary) written from the reference notes
(/work/shared/reference/qwen35.md, sections 2 and 4), not from skein's Go code, plus PEFT LoRA
(y += scale * x A^T B^T) with Tinker's split LoRAs on the row blocks of the fused in_proj_qkv.
Where skein runs the delta rule in its recurrent form, this script runs the chunked (WY / UT
transform) form of torch_chunk_gated_delta_rule with a small chunk so that sequences span
several chunks; both forms are the same function (reference section 5 measured 4e-15).
Run with Debian's python3-torch:

  SKEIN_REFERENCE_INPUTS=/tmp/q35 go test ./engine -run TestWriteQwen35ReferenceInputs
  /usr/bin/python3 scripts/reference_qwen35.py /tmp/q35 engine/testdata/reference_qwen35.json
"""
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)

CHUNK = 5  # chunk of the WY form; 12 tokens span 3 chunks, the last partial


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


def rms_zero_centred(x, w, eps):
    # Qwen3_5RMSNorm: x / rms(x) * (1 + w)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def rms_gated(x, z, w, eps):
    # Qwen3_5RMSNormGated: w * (x / rms(x)) * silu(z), plain weight
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)) * F.silu(z)


def l2norm(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


class Lin:
    """A linear module y = x W^T with its LoRA (if the adapter has one)."""

    def __init__(self, w, lora=None):
        self.w, self.lora = w, lora

    def __call__(self, x):
        y = x @ self.w.T
        if self.lora is not None:
            a, b, scale = self.lora
            y = y + scale * (x @ a.T) @ b.T
        return y


def chunk_gated_delta_rule(q, k, v, g, beta, C=CHUNK):
    """q, k [T, H, dk] (already l2-normed, q scaled), v [T, H, dv], g, beta [T, H] -> o [T, H, dv].

    Per chunk with gamma the chunk-local cumulative log-decay and Gamma_ij = exp(gamma_i - gamma_j)
    (i >= j): A = strictly-lower (diag(beta) K K^T) * Gamma; (I + A) U = diag(beta) V and
    (I + A) W = diag(beta) diag(e^gamma) K; V_new = U - W S; O = diag(e^gamma) Q S + (Q K^T * Gamma,
    lower incl. diagonal) V_new; S <- e^{gamma_last} S + (diag(e^{gamma_last - gamma}) K)^T V_new.
    """
    T, H, dk = q.shape
    dv = v.shape[-1]
    out = torch.zeros(T, H, dv)
    for h in range(H):
        S = torch.zeros(dk, dv)
        for c0 in range(0, T, C):
            c1 = min(T, c0 + C)
            Q, K, V = q[c0:c1, h], k[c0:c1, h], v[c0:c1, h]
            bt, gm = beta[c0:c1, h], torch.cumsum(g[c0:c1, h], 0)
            n = c1 - c0
            diff = gm[:, None] - gm[None, :]
            lower = torch.tril(torch.ones(n, n, dtype=torch.bool))
            Gam = torch.where(lower, torch.exp(torch.where(lower, diff, torch.zeros_like(diff))), torch.zeros_like(diff))
            A = torch.tril((bt[:, None] * (K @ K.T)) * Gam, -1)
            IA = torch.eye(n) + A
            U = torch.linalg.solve_triangular(IA, bt[:, None] * V, upper=False, unitriangular=True)
            W = torch.linalg.solve_triangular(IA, (bt * torch.exp(gm))[:, None] * K, upper=False, unitriangular=True)
            Vn = U - W @ S
            out[c0:c1, h] = torch.exp(gm)[:, None] * (Q @ S) + ((Q @ K.T) * Gam) @ Vn
            S = torch.exp(gm[-1]) * S + (torch.exp(gm[-1] - gm)[:, None] * K).T @ Vn
    return out


def dense_mlp(m, x, W, lin, tc):
    """Qwen3_5MLP: down(silu(gate(x)) * up(x))."""
    return lin(m + "down_proj")(F.silu(lin(m + "gate_proj")(x)) * lin(m + "up_proj")(x))


def forward(md, tokens, with_adapter, mlp=dense_mlp, vis=None):
    """The logits [T, V]; mlp(prefix, x, W, lin, text_config) is each layer's feed-forward block
    (scripts/reference_moe.py passes a mixture of experts). vis (scripts/reference_qwen35_vl.py):
    the image features that replace the pad tokens' embeddings (vis["feats"] at vis["mask"]) and
    the (t, h, w) position ids vis["pos"] [3, T] of interleaved mRoPE over the rotating dims."""
    cfg = json.loads((md / "config.json").read_text())
    vl = "text_config" in cfg
    tc = cfg["text_config"] if vl else cfg
    P = "model.language_model." if vl else "model."
    W = load_safetensors(md / "model.safetensors")
    assert vis is not None or not any(k.startswith("model.visual.") or k.startswith("mtp.") for k in W)
    lora = {}
    if with_adapter:
        ac = json.loads((md / "adapter" / "adapter_config.json").read_text())
        scale = ac["lora_alpha"] / ac["r"]
        aw = load_safetensors(md / "adapter" / "adapter_model.safetensors")
        for key, a in aw.items():
            if key.endswith(".lora_A.weight"):
                path = key[len("base_model.model."):-len(".lora_A.weight")]
                lora[path] = (a, aw[key.replace("lora_A", "lora_B")], scale)
    eps = tc["rms_norm_eps"]
    D, H, KVH, hd = tc["hidden_size"], tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    Hk, Hv, dk, dv = tc["linear_num_key_heads"], tc["linear_num_value_heads"], tc["linear_key_head_dim"], tc["linear_value_head_dim"]
    Kc = tc["linear_conv_kernel_dim"]
    rp = tc["rope_parameters"]
    rd = int(hd * rp["partial_rotary_factor"])
    theta = rp["rope_theta"]
    T = len(tokens)

    def lin(path):
        return Lin(W[path + ".weight"], lora.get(path))

    h = W[P + "embed_tokens.weight"][torch.tensor(tokens)]
    inv_freq = 1.0 / (theta ** (torch.arange(0, rd, 2, dtype=torch.get_default_dtype()) / rd))
    freqs = torch.arange(T, dtype=torch.get_default_dtype())[:, None] * inv_freq[None, :]
    if vis is not None:
        h = h.clone()
        h[vis["mask"]] = vis["feats"]
        # apply_interleaved_mrope: frequency i turns with h when i % 3 == 1 and i < 3·sec[1],
        # with w when i % 3 == 2 and i < 3·sec[2], else with t.
        f3 = vis["pos"][:, :, None].double() * inv_freq[None, None, :]
        sec = rp["mrope_section"]
        freqs = f3[0].clone()
        for dim in (1, 2):
            idx = slice(dim, sec[dim] * 3, 3)
            freqs[..., idx] = f3[dim, ..., idx]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos(), emb.sin()  # [T, rd]

    def rope(x):  # x [T, heads, hd]: only the first rd dims rotate (rotate_half over rd)
        xr, xp = x[..., :rd], x[..., rd:]
        x1, x2 = xr[..., :rd // 2], xr[..., rd // 2:]
        rot = torch.cat([-x2, x1], -1)
        return torch.cat([xr * cos[:, None, :] + rot * sin[:, None, :], xp], -1)

    for l, kind in enumerate(tc["layer_types"]):
        p = f"{P}layers.{l}."
        x = rms_zero_centred(h, W[p + "input_layernorm.weight"], eps)
        if kind == "linear_attention":
            a_ = p + "linear_attn."
            Kd, Vd = Hk * dk, Hv * dv
            # in_proj_qkv is fused in the checkpoint; Tinker's LoRAs sit on its q, k, v row blocks.
            fused = x @ W[a_ + "in_proj_qkv.weight"].T
            for name, (r0, r1) in (("in_proj_q", (0, Kd)), ("in_proj_k", (Kd, 2 * Kd)), ("in_proj_v", (2 * Kd, 2 * Kd + Vd))):
                if a_ + name in lora:
                    A, B, s = lora[a_ + name]
                    fused[:, r0:r1] = fused[:, r0:r1] + s * (x @ A.T) @ B.T
            z = lin(a_ + "in_proj_z")(x).reshape(T, Hv, dv)
            b = x @ W[a_ + "in_proj_b.weight"].T
            a = x @ W[a_ + "in_proj_a.weight"].T
            Cc = fused.shape[1]
            conv = F.conv1d(fused.T[None], W[a_ + "conv1d.weight"], padding=Kc - 1, groups=Cc)[..., :T]
            mixed = F.silu(conv)[0].T  # [T, C]
            q, k, v = mixed[:, :Kd], mixed[:, Kd:2 * Kd], mixed[:, 2 * Kd:]
            q, k, v = q.reshape(T, Hk, dk), k.reshape(T, Hk, dk), v.reshape(T, Hv, dv)
            beta = torch.sigmoid(b)
            g = -torch.exp(W[a_ + "A_log"]) * F.softplus(a + W[a_ + "dt_bias"])
            r = Hv // Hk
            q, k = q.repeat_interleave(r, dim=1), k.repeat_interleave(r, dim=1)
            q, k = l2norm(q) / math.sqrt(dk), l2norm(k)
            o = chunk_gated_delta_rule(q, k, v, g, beta)
            y = rms_gated(o, z, W[a_ + "norm.weight"], eps).reshape(T, Vd)
            h = h + lin(a_ + "out_proj")(y)
        else:
            s_ = p + "self_attn."
            qg = lin(s_ + "q_proj")(x).view(T, H, 2 * hd)
            q, gate = qg[..., :hd], qg[..., hd:].reshape(T, H * hd)
            q = rms_zero_centred(q, W[s_ + "q_norm.weight"], eps)
            k = rms_zero_centred(lin(s_ + "k_proj")(x).view(T, KVH, hd), W[s_ + "k_norm.weight"], eps)
            v = lin(s_ + "v_proj")(x).view(T, KVH, hd)
            q, k = rope(q), rope(k)
            k, v = k.repeat_interleave(H // KVH, dim=1), v.repeat_interleave(H // KVH, dim=1)  # repeat_kv
            scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
            scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
            att = torch.einsum("hts,shd->thd", torch.softmax(scores, -1), v).reshape(T, H * hd)
            h = h + lin(s_ + "o_proj")(att * torch.sigmoid(gate))
        x = rms_zero_centred(h, W[p + "post_attention_layernorm.weight"], eps)
        h = h + mlp(p + "mlp.", x, W, lin, tc)
    h = rms_zero_centred(h, W[P + "norm.weight"], eps)
    tied = cfg.get("tie_word_embeddings", tc.get("tie_word_embeddings"))
    head = W[P + "embed_tokens.weight"] if tied else W["lm_head.weight"]
    return Lin(head, lora.get("lm_head"))(h)


def main():
    indir, out = Path(sys.argv[1]), sys.argv[2]
    inputs = json.loads((indir / "inputs.json").read_text())
    cases = []
    for c in inputs["cases"]:
        logits = forward(indir / c["arch"], c["tokens"], c["adapter"])
        c = dict(c, vocab=logits.shape[1], logits=[float(x) for x in logits.reshape(-1)])
        cases.append(c)
        print(c["arch"], "adapter" if c["adapter"] else "base", "logits", logits.shape, "max |logit|", float(logits.abs().max()))
    Path(out).write_text(json.dumps({"cases": cases}))


if __name__ == "__main__":
    main()

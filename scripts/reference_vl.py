"""Independent reference for the engine's Qwen3-VL forward (development time only; CI reads the fixture).

A direct torch transcription, in float64, of Hugging Face's modeling_qwen3_vl forward for images
(transformers 4.57; written from its source as we know it, not run against it — transformers is not
installable here):
  - Qwen3VLVisionModel: patch_embed (Conv3d, stride = kernel, with bias), pos_embed bilinearly
    interpolated to each grid (fast_pos_embed_interpolate) and permuted into merge-block order,
    2D rotary (rot_pos_emb), blocks of LayerNorm + attention (per image, non-causal) + MLP
    (ACT2FN[vision_config.hidden_act]: gelu_pytorch_tanh or gelu), the merger (LayerNorm per
    patch, view 4·D, fc1, exact GELU, fc2) and DeepStack
    mergers (view 4·D, LayerNorm, fc1, GELU, fc2) after the blocks of deepstack_visual_indexes;
  - Qwen3VLModel: image features scattered over the image pad tokens, get_rope_index (t, h, w)
    position ids, DeepStack features added to the outputs of LM layers 0..k-1 at the image tokens;
  - the Qwen3 LM with interleaved mRoPE (apply_interleaved_mrope), q/k RMSNorm, tied lm_head.

  /usr/bin/python3 scripts/reference_vl.py MODEL_DIR OUT_JSON

MODEL_DIR is `skein model init-tiny MODEL_DIR --arch qwen3_vl` (seed 1). The pixels are a formula
the Go test computes too (pixel below).
"""
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from reference_logits import load_safetensors, rms, rotate_half  # noqa: E402

torch.set_default_dtype(torch.float64)

GRIDS = [(1, 4, 4), (1, 4, 6)]


def pixel(i, j):
    """pixel_values[i][j], rounded to float32 as the wire carries it (Go: referencePixel)."""
    return float(torch.tensor(math.sin(0.731 * i + 0.0137 * j) * 1.5, dtype=torch.float32))


def tokens_for(cfg):
    vs, ve, pad = cfg["vision_start_token_id"], cfg["vision_end_token_id"], cfg["image_token_id"]
    m = cfg["vision_config"]["spatial_merge_size"]
    toks = [5, 17, 300]
    for k, (t, h, w) in enumerate(GRIDS):
        toks += [vs] + [pad] * (t * (h // m) * (w // m)) + [ve]
        toks += [[42, 7, 99], [256, 3, 64, 128, 11]][k]
    return toks


def vision(W, vc, pixel_values, grid_thw):
    P, Tp, C, D = vc["patch_size"], vc["temporal_patch_size"], vc["in_channels"], vc["hidden_size"]
    # Qwen3VLVisionMLP: ACT2FN[config.hidden_act]; the released towers say gelu_pytorch_tanh.
    approximate = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}[vc["hidden_act"]]
    m = vc["spatial_merge_size"]
    H = vc["num_heads"]
    hd = D // H
    x = pixel_values.view(-1, C, Tp, P, P)
    h = F.conv3d(x, W["model.visual.patch_embed.proj.weight"], W["model.visual.patch_embed.proj.bias"],
                 stride=(Tp, P, P)).view(-1, D)
    # fast_pos_embed_interpolate
    side = int(vc["num_position_embeddings"] ** 0.5)
    table = W["model.visual.pos_embed.weight"]
    pos_parts = []
    for t, gh, gw in grid_thw:
        h_idxs = torch.linspace(0, side - 1, gh)
        w_idxs = torch.linspace(0, side - 1, gw)
        hf, wf = h_idxs.int(), w_idxs.int()
        hc, wc = (hf + 1).clip(max=side - 1), (wf + 1).clip(max=side - 1)
        dh, dw = h_idxs - hf, w_idxs - wf
        idx = [(hf[:, None] * side + wf[None]).flatten(), (hf[:, None] * side + wc[None]).flatten(),
               (hc[:, None] * side + wf[None]).flatten(), (hc[:, None] * side + wc[None]).flatten()]
        wts = [((1 - dh)[:, None] * (1 - dw)[None]).flatten(), ((1 - dh)[:, None] * dw[None]).flatten(),
               (dh[:, None] * (1 - dw)[None]).flatten(), (dh[:, None] * dw[None]).flatten()]
        pe = sum(table[i.long()] * w[:, None] for i, w in zip(idx, wts))
        pe = pe.repeat(t, 1).view(t, gh // m, m, gw // m, m, -1).permute(0, 1, 3, 2, 4, 5).flatten(0, 4)
        pos_parts.append(pe)
    h = h + torch.cat(pos_parts)
    # rot_pos_emb
    rdim = hd // 2
    inv = 1.0 / (10000 ** (torch.arange(0, rdim, 2, dtype=torch.float64) / rdim))
    coords = []
    for t, gh, gw in grid_thw:
        br, bc = torch.arange(gh // m), torch.arange(gw // m)
        ir, ic = torch.arange(m), torch.arange(m)
        row = (br[:, None, None, None] * m + ir[None, None, :, None]).expand(gh // m, gw // m, m, m).reshape(-1)
        col = (bc[None, :, None, None] * m + ic[None, None, None, :]).expand(gh // m, gw // m, m, m).reshape(-1)
        coords.append(torch.stack((row, col), -1).repeat(t, 1))
    coords = torch.cat(coords)
    freqs = torch.outer(torch.arange(max(max(g[1], g[2]) for g in grid_thw), dtype=torch.float64), inv)
    rot = freqs[coords].flatten(1)
    emb = torch.cat((rot, rot), -1)
    cos, sin = emb.cos(), emb.sin()
    seqlens = [gh * gw for t, gh, gw in grid_thw for _ in range(t)]
    cu = [0]
    for s in seqlens:
        cu.append(cu[-1] + s)

    def ln(x, p):
        return F.layer_norm(x, (x.shape[-1],), W[p + ".weight"], W[p + ".bias"], eps=1e-6)

    def lin(x, p):
        return x @ W[p + ".weight"].T + W[p + ".bias"]

    def merger(x, p, post):
        if post:
            x = ln(x.view(-1, D * m * m), p + ".norm")
        else:
            x = ln(x, p + ".norm").view(-1, D * m * m)
        return lin(F.gelu(lin(x, p + ".linear_fc1")), p + ".linear_fc2")

    n = h.shape[0]
    deep = []
    for b in range(vc["depth"]):
        p = f"model.visual.blocks.{b}."
        x = ln(h, p + "norm1")
        qkv = lin(x, p + "attn.qkv").reshape(n, 3, H, hd).permute(1, 0, 2, 3)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * cos[:, None] + rotate_half(q) * sin[:, None]
        k = k * cos[:, None] + rotate_half(k) * sin[:, None]
        outs = []
        for s0, s1 in zip(cu[:-1], cu[1:]):
            qs, ks, vs = q[s0:s1].transpose(0, 1), k[s0:s1].transpose(0, 1), v[s0:s1].transpose(0, 1)
            a = (qs @ ks.transpose(-1, -2)) * hd ** -0.5
            outs.append((a.softmax(-1) @ vs).transpose(0, 1).reshape(s1 - s0, D))
        h = h + lin(torch.cat(outs), p + "attn.proj")
        x = ln(h, p + "norm2")
        h = h + lin(F.gelu(lin(x, p + "mlp.linear_fc1"), approximate=approximate), p + "mlp.linear_fc2")
        if b in vc["deepstack_visual_indexes"]:
            j = vc["deepstack_visual_indexes"].index(b)
            deep.append(merger(h, f"model.visual.deepstack_merger_list.{j}", True))
    return merger(h, "model.visual.merger", False), deep


def rope_index(cfg, tokens, grid_thw):
    """get_rope_index for one sequence of images: (3, T) position ids and the delta."""
    pad, m = cfg["image_token_id"], cfg["vision_config"]["spatial_merge_size"]
    parts, st = [], 0
    for t, gh, gw in grid_thw:
        ed = tokens.index(pad, st)
        lt, lh, lw = t, gh // m, gw // m
        text_len = ed - st
        st_idx = parts[-1].max() + 1 if parts else 0
        parts.append(torch.arange(text_len).view(1, -1).expand(3, -1) + st_idx)
        ti = torch.arange(lt).view(-1, 1).expand(-1, lh * lw).flatten()
        hi = torch.arange(lh).view(1, -1, 1).expand(lt, -1, lw).flatten()
        wi = torch.arange(lw).view(1, 1, -1).expand(lt, lh, -1).flatten()
        parts.append(torch.stack([ti, hi, wi]) + text_len + st_idx)
        st = ed + lt * lh * lw
    if st < len(tokens):
        st_idx = parts[-1].max() + 1 if parts else 0
        parts.append(torch.arange(len(tokens) - st).view(1, -1).expand(3, -1) + st_idx)
    pos = torch.cat(parts, 1)
    return pos, int(pos.max()) + 1 - len(tokens)


def forward(model_dir):
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    tc, vc = cfg["text_config"], cfg["vision_config"]
    W = load_safetensors(Path(model_dir) / "model.safetensors")
    tokens = tokens_for(cfg)
    patch_dim = vc["in_channels"] * vc["temporal_patch_size"] * vc["patch_size"] ** 2
    n_patches = sum(t * h * w for t, h, w in GRIDS)
    pv = torch.tensor([[pixel(i, j) for j in range(patch_dim)] for i in range(n_patches)])
    img, deep = vision(W, vc, pv, GRIDS)

    H, KV, D = tc["num_attention_heads"], tc["num_key_value_heads"], tc["hidden_size"]
    hd = tc.get("head_dim") or D // H
    eps = tc["rms_norm_eps"]
    T = len(tokens)
    lm = "model.language_model."
    h = W[lm + "embed_tokens.weight"][torch.tensor(tokens)].clone()
    mask_img = torch.tensor(tokens) == cfg["image_token_id"]
    h[mask_img] = img
    pos, delta = rope_index(cfg, tokens, GRIDS)
    inv = 1.0 / (tc["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = pos[:, :, None].double() * inv[None, None, :]  # (3, T, hd/2)
    sec = tc["rope_scaling"]["mrope_section"]
    f = freqs[0].clone()
    for dim, offset in enumerate((1, 2), start=1):
        idx = slice(offset, sec[dim] * 3, 3)
        f[..., idx] = freqs[dim, ..., idx]
    emb = torch.cat((f, f), -1)
    cos, sin = emb.cos(), emb.sin()
    causal = torch.full((T, T), float("-inf")).triu(1)

    def linear(x, mod):
        y = x @ W[mod + ".weight"].T
        if (mod + ".bias") in W:
            y = y + W[mod + ".bias"]
        return y

    for l in range(tc["num_hidden_layers"]):
        p = f"{lm}layers.{l}."
        x = rms(h, W[p + "input_layernorm.weight"], eps)
        q = linear(x, p + "self_attn.q_proj").view(T, H, hd).transpose(0, 1)
        k = linear(x, p + "self_attn.k_proj").view(T, KV, hd).transpose(0, 1)
        v = linear(x, p + "self_attn.v_proj").view(T, KV, hd).transpose(0, 1)
        q = rms(q, W[p + "self_attn.q_norm.weight"], eps)
        k = rms(k, W[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=0)
        v = v.repeat_interleave(H // KV, dim=0)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd) + causal
        o = (att.softmax(-1) @ v).transpose(0, 1).reshape(T, H * hd)
        h = h + linear(o, p + "self_attn.o_proj")
        x = rms(h, W[p + "post_attention_layernorm.weight"], eps)
        h = h + linear(F.silu(linear(x, p + "mlp.gate_proj")) * linear(x, p + "mlp.up_proj"), p + "mlp.down_proj")
        if l < len(deep):
            h[mask_img] = h[mask_img] + deep[l]
    h = rms(h, W[lm + "norm.weight"], eps)
    head = W[lm + "embed_tokens.weight"] if cfg.get("tie_word_embeddings") else W["lm_head.weight"]
    return tokens, pos, delta, h @ head.T


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    tokens, pos, delta, logits = forward(model_dir)
    Path(out).write_text(json.dumps({
        "generator": "scripts/reference_vl.py (torch %s, float64)" % torch.__version__,
        "tokens": tokens, "grids": [list(g) for g in GRIDS], "positions": pos.tolist(), "delta": delta,
        "vocab": logits.shape[1], "logits": [round(float(x), 7) for x in logits.flatten()]}))


if __name__ == "__main__":
    main()

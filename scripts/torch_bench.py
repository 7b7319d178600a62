#!/usr/bin/env python3
"""PyTorch's side of `skein bench engine`: LoRA training tokens/s on the same shapes.

Reads a model directory's config.json (Llama/Qwen2/Qwen3 dense: the `skein model init-tiny`
presets), builds the same decoder in plain torch (no transformers: it cannot be installed here)
with random weights, puts LoRA of the given rank on q/k/v/o and the MLP (as `skein bench engine`
does: attention and MLP, not the head), and times forward + backward + AdamW over batch x seq
random tokens with cross-entropy. Base weights are frozen. With --precision bf16 the step runs
under CPU autocast to bfloat16 (linear layers and matmuls in bf16, f32 accumulation, as oneDNN
does), which is what skein's bf16 path is compared with; f32 runs in float32.

Dev-time only (Debian's python3-torch): run it beside skein in the same session, e.g.
    /usr/bin/python3 scripts/torch_bench.py --model /tmp/skein-small --precision bf16
and read the tokens/s line. Prints one JSON object with --json.
"""
import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F


def rms_norm(x, w, eps):
    v = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(v + eps)).to(x.dtype) * w


class LoRALinear(torch.nn.Module):
    def __init__(self, d_in, d_out, rank, bias=False):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(d_out, d_in) * 0.02, requires_grad=False)
        self.bias = torch.nn.Parameter(torch.zeros(d_out), requires_grad=False) if bias else None
        self.rank = rank
        if rank:
            self.a = torch.nn.Parameter(torch.randn(rank, d_in) / math.sqrt(d_in))
            self.b = torch.nn.Parameter(torch.zeros(d_out, rank) + 1e-3)
            self.scale = 32.0 / rank

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        if self.rank:
            y = y + F.linear(F.linear(x, self.a), self.b) * self.scale
        return y


def rope(x, pos, theta):
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    f = torch.outer(pos.float(), inv)
    cos, sin = torch.cat([f, f], -1).cos().to(x.dtype), torch.cat([f, f], -1).sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Layer(torch.nn.Module):
    def __init__(self, c, rank, qkv_bias, head_norm):
        super().__init__()
        D, H, KV = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        hd = c.get("head_dim") or D // H
        self.H, self.KV, self.hd, self.eps, self.theta = H, KV, hd, c["rms_norm_eps"], c.get("rope_theta", 10000)
        self.q = LoRALinear(D, H * hd, rank, qkv_bias)
        self.k = LoRALinear(D, KV * hd, rank, qkv_bias)
        self.v = LoRALinear(D, KV * hd, rank, qkv_bias)
        self.o = LoRALinear(H * hd, D, rank)
        F_ = c["intermediate_size"]
        self.gate, self.up, self.down = LoRALinear(D, F_, rank), LoRALinear(D, F_, rank), LoRALinear(F_, D, rank)
        self.n1 = torch.nn.Parameter(torch.ones(D), requires_grad=False)
        self.n2 = torch.nn.Parameter(torch.ones(D), requires_grad=False)
        self.head_norm = head_norm
        if head_norm:
            self.qn = torch.nn.Parameter(torch.ones(hd), requires_grad=False)
            self.kn = torch.nn.Parameter(torch.ones(hd), requires_grad=False)

    def forward(self, x, pos):
        B, T, D = x.shape
        h = rms_norm(x, self.n1, self.eps)
        q = self.q(h).view(B, T, self.H, self.hd).transpose(1, 2)
        k = self.k(h).view(B, T, self.KV, self.hd).transpose(1, 2)
        v = self.v(h).view(B, T, self.KV, self.hd).transpose(1, 2)
        if self.head_norm:
            q, k = rms_norm(q, self.qn, self.eps), rms_norm(k, self.kn, self.eps)
        q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)
        rep = self.H // self.KV
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        a = (s.float().softmax(-1).to(q.dtype) @ v).transpose(1, 2).reshape(B, T, -1)
        x = x + self.o(a)
        h = rms_norm(x, self.n2, self.eps)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="intra-op threads (default: every CPU, as skein uses; torch itself may pick fewer)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    c = json.load(open(f"{args.model}/config.json"))
    mt = c.get("model_type", "llama")
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(
        [Layer(c, args.rank, mt == "qwen2", mt == "qwen3") for _ in range(c["num_hidden_layers"])])
    V, D = c["vocab_size"], c["hidden_size"]
    embed = torch.randn(V, D) * 0.02
    norm = torch.ones(D)
    params = [p for p in layers.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    ids = torch.randint(0, V, (args.batch, args.seq))
    tgt = torch.randint(0, V, (args.batch, args.seq))
    pos = torch.arange(args.seq)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            x = embed[ids]
            for L in layers:
                x = L(x, pos)
            logits = F.linear(rms_norm(x, norm, c["rms_norm_eps"]), embed)
            loss = F.cross_entropy(logits.float().view(-1, V), tgt.view(-1), reduction="sum")
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    first = step()
    best = float("inf")
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    tok = args.batch * args.seq / best
    out = {"precision": args.precision, "train_tokens_per_s": tok, "step_ms": best * 1e3, "first_loss": first,
           "torch": torch.__version__, "threads": torch.get_num_threads()}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"torch {torch.__version__} {args.precision}: {tok:.0f} tokens/s, {best*1e3:.1f} ms per step "
              f"({torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()

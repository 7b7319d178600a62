"""Independent float64 reference for skein's Qwen3.5 with images (development time only; CI reads the fixture).

Qwen3_5ForConditionalGeneration's forward over a prompt with two images, transcribed from the
reference notes (qwen35.md sections 1.3 and 1.4): the vision tower is Qwen3-VL's without DeepStack
(scripts/reference_vl.py's `vision`, with an empty deepstack_visual_indexes), its merged features
replace the image pad tokens' embeddings, get_rope_index gives the (t, h, w) position ids as in
Qwen3-VL, and the hybrid LM (scripts/reference_qwen35.py's `forward`) rotates the first quarter of
each head by interleaved mRoPE.

  skein model init-tiny /tmp/q35vl --arch qwen3_5 --preset tiny-vl
  /usr/bin/python3 scripts/reference_qwen35_vl.py /tmp/q35vl engine/testdata/reference_qwen35_vl.json
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import reference_qwen35 as q35  # noqa: E402
import reference_vl as vl  # noqa: E402

torch.set_default_dtype(torch.float64)


def main():
    md, out = Path(sys.argv[1]), sys.argv[2]
    cfg = json.loads((md / "config.json").read_text())
    vc = dict(cfg["vision_config"], deepstack_visual_indexes=[])
    W = q35.load_safetensors(md / "model.safetensors")
    assert not any(k.startswith("model.visual.deepstack") for k in W)
    tokens = vl.tokens_for(cfg)
    patch_dim = vc["in_channels"] * vc["temporal_patch_size"] * vc["patch_size"] ** 2
    n_patches = sum(t * h * w for t, h, w in vl.GRIDS)
    pv = torch.tensor([[vl.pixel(i, j) for j in range(patch_dim)] for i in range(n_patches)])
    feats, deep = vl.vision(W, vc, pv, vl.GRIDS)
    assert not deep
    pos, delta = vl.rope_index(cfg, tokens, vl.GRIDS)
    mask = torch.tensor(tokens) == cfg["image_token_id"]
    logits = q35.forward(md, tokens, False, vis={"feats": feats, "mask": mask, "pos": pos})
    Path(out).write_text(json.dumps({
        "generator": "scripts/reference_qwen35_vl.py (torch %s, float64)" % torch.__version__,
        "tokens": tokens, "grids": [list(g) for g in vl.GRIDS], "positions": pos.tolist(), "delta": delta,
        "vocab": logits.shape[1], "logits": [round(float(x), 7) for x in logits.flatten()]}))
    print("logits", tuple(logits.shape), "max |logit|", float(logits.abs().max()))


if __name__ == "__main__":
    main()

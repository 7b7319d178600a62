"""Drive a running skein serving a tiny vision-language model with the real tinker SDK: an
ImageChunk training flow and a sample with an image in the prompt (development-time check; CI
replays the recorded traffic, gateway/testdata/sdk-0.25.0-vl.jsonl).

Usage:
  skein model init-tiny /tmp/tiny-vl --arch qwen3_vl
  skein serve --model /tmp/tiny-vl --data /tmp/vl-data --record gateway/testdata/sdk-0.25.0-vl.jsonl &
  source <(shared/tools/tinker-sdk-env.sh SDK_GIT_DIR); python3 scripts/sdk_vl_smoke.py http://127.0.0.1:8000
"""
import struct
import sys
import zlib

import tinker
from tinker import types


def png(width, height, tint):
    """A width×height RGB PNG (no PIL here): a gradient so every patch differs."""
    rows = b""
    for y in range(height):
        rows += b"\x00" + b"".join(bytes([(x * 4) % 256, (y * 4) % 256, tint]) for x in range(width))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


base_url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
sc = tinker.ServiceClient(base_url=base_url, api_key="tml-sdk-smoke")
caps = sc.get_server_capabilities()
model = caps.supported_models[0].model_name
print("capabilities:", caps)

# The tiny model's preprocessor: 16-pixel patches merged 2×2, so 64×96 pixels are 4×6 patches,
# 6 LM tokens.
image = types.ImageChunk(data=png(64, 96, 200), format="png", expected_tokens=6)
before, after = [10, 20], [30, 40, 50, 60, 70]
n = len(before) + 6 + len(after)
targets, weights = [0] * n, [0.0] * n
for i in range(len(after) - 1):  # predict the text after the image
    targets[len(before) + 6 + i] = after[i + 1]
    weights[len(before) + 6 + i] = 1.0
datum = types.Datum(
    model_input=types.ModelInput(chunks=[types.EncodedTextChunk(tokens=before), image, types.EncodedTextChunk(tokens=after)]),
    loss_fn_inputs={"target_tokens": targets, "weights": weights},
)

tc = sc.create_lora_training_client(base_model=model, rank=8)
losses = []
for step in range(6):
    fb = tc.forward_backward([datum], "cross_entropy")
    opt = tc.optim_step(types.AdamParams(learning_rate=2e-2))
    out = fb.result()
    opt.result()
    losses.append(out.metrics["loss:sum"])
print("losses:", [round(x, 3) for x in losses])
assert losses[-1] < losses[0] * 0.8, losses
fwd = tc.forward([datum], "cross_entropy").result()
lp = fwd.loss_fn_outputs[0]["logprobs"].tolist()
print("forward logprobs:", len(lp), [round(x, 4) for x in lp[-3:]])
assert len(lp) == n, (len(lp), n)

wrong = types.Datum(
    model_input=types.ModelInput(chunks=[types.EncodedTextChunk(tokens=before),
                                         types.ImageChunk(data=image.data, format="png", expected_tokens=7),
                                         types.EncodedTextChunk(tokens=after)]),
    loss_fn_inputs={"target_tokens": [0] * (n + 1), "weights": [0.0] * (n + 1)},
)
try:
    tc.forward([wrong], "cross_entropy").result()
    raise AssertionError("expected_tokens 7 for a 6-token image was accepted")
except tinker.BadRequestError as e:
    print("expected_tokens mismatch:", e)

sampling = tc.save_weights_and_get_sampling_client()
prompt = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=before), image, types.EncodedTextChunk(tokens=after[:1])])
res = sampling.sample(prompt, num_samples=2, sampling_params=types.SamplingParams(max_tokens=4, seed=5, temperature=1.0)).result()
for s in res.sequences:
    print("sample:", s.tokens, s.stop_reason)
text = sampling.sample(types.ModelInput.from_ints(before), num_samples=1,
                       sampling_params=types.SamplingParams(max_tokens=4, seed=5)).result()
print("text-only sample:", text.sequences[0].tokens)
print("ok")

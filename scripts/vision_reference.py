#!/usr/bin/python3
"""Reference fixture for engine/imageproc: Qwen2-VL/Qwen3-VL image preprocessing, transcribed.

transformers is not installable here, so this is a transcription in numpy + PIL of the steps
of transformers' Qwen2VLImageProcessor._preprocess (the slow, PIL-based processor):

  PIL open -> convert("RGB") -> smart_resize -> PIL resize(BICUBIC) -> uint8
  -> rescale (float64 * rescale_factor -> float32) -> normalise ((x - mean) / std, float32)
  -> channel-first -> repeat to temporal_patch_size frames -> reshape/transpose into patches.

Run with Debian's python3-pil and python3-numpy (apt-get install -y python3-pil python3-numpy):

  /usr/bin/python3 scripts/vision_reference.py engine/imageproc/testdata

It writes the test images (small PNGs with and without alpha, a JPEG, odd sizes, one that
smart_resize must scale up to min_pixels, one it must scale down to max_pixels) and
expected.json: per image the resized size, the grid, the token count, the resized uint8
pixels in full (base64; they are small), and a few hundred sampled pixel_values entries with
their sum and absolute sum. The sampled entries pin the flattening order; the uint8 pixels pin
the resampler.
"""
import base64
import json
import math
import os
import sys

import numpy as np
from PIL import Image


def smart_resize(height, width, factor, min_pixels, max_pixels):
    # transformers/models/qwen2_vl/image_processing_qwen2_vl.py, verbatim in logic.
    if max(height, width) / min(height, width) > 200:
        raise ValueError("absolute aspect ratio must be smaller than 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def preprocess(path, cfg):
    img = Image.open(path)
    img = img.convert("RGB")  # drops alpha, as do_convert_rgb does
    width, height = img.size
    patch, merge, temporal = cfg["patch_size"], cfg["merge_size"], cfg["temporal_patch_size"]
    rh, rw = smart_resize(height, width, patch * merge, cfg["min_pixels"], cfg["max_pixels"])
    resized = img.resize((rw, rh), resample=Image.BICUBIC, reducing_gap=None)
    u8 = np.array(resized, dtype=np.uint8)  # H, W, C
    x = (u8.astype(np.float64) * cfg["rescale_factor"]).astype(np.float32)
    mean = np.array(cfg["image_mean"], dtype=np.float32)
    std = np.array(cfg["image_std"], dtype=np.float32)
    x = (x - mean) / std
    x = x.transpose(2, 0, 1)  # C, H, W
    patches = x[np.newaxis]  # one frame
    if patches.shape[0] % temporal != 0:
        repeats = np.repeat(patches[-1][np.newaxis], temporal - (patches.shape[0] % temporal), axis=0)
        patches = np.concatenate([patches, repeats], axis=0)
    channel = patches.shape[1]
    grid_t = patches.shape[0] // temporal
    grid_h, grid_w = rh // patch, rw // patch
    patches = patches.reshape(
        grid_t, temporal, channel,
        grid_h // merge, merge, patch,
        grid_w // merge, merge, patch,
    )
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = patches.reshape(grid_t * grid_h * grid_w, channel * temporal * patch * patch)
    return u8, flat, (grid_t, grid_h, grid_w), (rh, rw)


def make_images(out):
    rng = np.random.default_rng(1234)
    images = {}

    # RGBA PNG, odd size, smooth gradient plus noise, alpha varying (convert("RGB") drops it).
    h, w = 37, 53
    yy, xx = np.mgrid[0:h, 0:w]
    rgba = np.zeros((h, w, 4), dtype=np.uint8)
    rgba[..., 0] = (xx * 255 // (w - 1)).astype(np.uint8)
    rgba[..., 1] = (yy * 255 // (h - 1)).astype(np.uint8)
    rgba[..., 2] = rng.integers(0, 256, (h, w), dtype=np.uint8)
    rgba[..., 3] = ((xx + yy) * 255 // (w + h - 2)).astype(np.uint8)
    Image.fromarray(rgba, "RGBA").save(os.path.join(out, "alpha_37x53.png"))
    images["alpha_37x53.png"] = "png"

    # RGB PNG of pure noise: the hardest case for a resampler.
    noise = rng.integers(0, 256, (70, 45, 3), dtype=np.uint8)
    Image.fromarray(noise, "RGB").save(os.path.join(out, "noise_70x45.png"))
    images["noise_70x45.png"] = "png"

    # Tiny grey PNG that must be scaled up to min_pixels.
    grey = rng.integers(0, 256, (9, 13), dtype=np.uint8)
    Image.fromarray(grey, "L").save(os.path.join(out, "grey_9x13.png"))
    images["grey_9x13.png"] = "png"

    # Larger smooth PNG that must be scaled down to max_pixels (antialiased downscale).
    h, w = 150, 210
    yy, xx = np.mgrid[0:h, 0:w]
    big = np.stack([
        (127.5 + 127.5 * np.sin(xx / 7.0)),
        (127.5 + 127.5 * np.cos(yy / 5.0)),
        ((xx * yy) % 256),
    ], axis=-1).astype(np.uint8)
    Image.fromarray(big, "RGB").save(os.path.join(out, "waves_150x210.png"))
    images["waves_150x210.png"] = "png"

    # Paletted PNG.
    pal = Image.fromarray(big[:40, :60], "RGB").quantize(colors=16)
    pal.save(os.path.join(out, "palette_40x60.png"))
    images["palette_40x60.png"] = "png"

    # JPEG of smooth content, as photos are (libjpeg and Go's decoder differ by a few levels,
    # more at sharp chroma edges, where the chroma upsamplers differ: compared loosely).
    h, w = 48, 80
    yy, xx = np.mgrid[0:h, 0:w]
    smooth = np.stack([
        (127.5 + 100 * np.sin(xx / 9.0)),
        (127.5 + 100 * np.cos(yy / 7.0)),
        (40 + xx + 2 * yy),
    ], axis=-1).astype(np.uint8)
    Image.fromarray(smooth, "RGB").save(os.path.join(out, "photo_48x80.jpg"), quality=90)
    images["photo_48x80.jpg"] = "jpeg"
    return images


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "engine/imageproc/testdata"
    os.makedirs(out, exist_ok=True)
    images = make_images(out)
    # Small pixel bounds keep the fixture small; patch/merge/temporal are Qwen3-VL's.
    cfg = {
        "patch_size": 16, "merge_size": 2, "temporal_patch_size": 2,
        "min_pixels": 64 * 64, "max_pixels": 128 * 128,
        "rescale_factor": 0.00392156862745098,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    }
    with open(os.path.join(out, "preprocessor_config.json"), "w") as f:
        json.dump({
            "patch_size": cfg["patch_size"], "merge_size": cfg["merge_size"],
            "temporal_patch_size": cfg["temporal_patch_size"],
            "size": {"shortest_edge": cfg["min_pixels"], "longest_edge": cfg["max_pixels"]},
            "rescale_factor": cfg["rescale_factor"],
            "image_mean": cfg["image_mean"], "image_std": cfg["image_std"],
            "image_processor_type": "Qwen2VLImageProcessor",
        }, f, indent=1)
    rng = np.random.default_rng(99)
    expected = {}
    for name, fmt in sorted(images.items()):
        u8, flat, grid, (rh, rw) = preprocess(os.path.join(out, name), cfg)
        rows, cols = flat.shape
        idx = rng.integers(0, rows * cols, 300)
        expected[name] = {
            "format": fmt,
            "resized_height": rh, "resized_width": rw,
            "grid_thw": list(grid),
            "tokens": grid[0] * grid[1] * grid[2] // (cfg["merge_size"] ** 2),
            "shape": [rows, cols],
            "resized_rgb_base64": base64.b64encode(u8.tobytes()).decode(),
            "sample_index": [int(i) for i in idx],
            "sample_value": [float(flat.reshape(-1)[i]) for i in idx],
            "sum": float(flat.astype(np.float64).sum()),
            "abs_sum": float(np.abs(flat.astype(np.float64)).sum()),
        }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)

    # Qwen3-VL's own configuration (min_pixels 65536: every test image is scaled up, to about
    # 256×256, so only samples and sums are kept).
    qwen3 = dict(cfg, min_pixels=65536, max_pixels=16777216, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    expected_qwen3 = {}
    for name, fmt in sorted(images.items()):
        if fmt != "png":
            continue
        u8, flat, grid, (rh, rw) = preprocess(os.path.join(out, name), qwen3)
        rows, cols = flat.shape
        idx = rng.integers(0, rows * cols, 300)
        expected_qwen3[name] = {
            "format": fmt, "resized_height": rh, "resized_width": rw, "grid_thw": list(grid),
            "tokens": grid[0] * grid[1] * grid[2] // (qwen3["merge_size"] ** 2), "shape": [rows, cols],
            "sample_index": [int(i) for i in idx],
            "sample_value": [float(flat.reshape(-1)[i]) for i in idx],
            "sum": float(flat.astype(np.float64).sum()),
            "abs_sum": float(np.abs(flat.astype(np.float64)).sum()),
        }
    with open(os.path.join(out, "expected_qwen3.json"), "w") as f:
        json.dump(expected_qwen3, f, indent=1)

    # smart_resize alone, over sizes that hit every branch: Python's round-half-to-even
    # (80/32 = 2.5 rounds to 2), the max_pixels and min_pixels branches, Qwen3-VL's and
    # Qwen2-VL's bounds, and aspect ratios at and over 200.
    cases = []
    bounds = [(32, 64 * 64, 128 * 128), (32, 65536, 16777216), (28, 56 * 56, 28 * 28 * 1280)]
    sizes = [(48, 80), (80, 48), (80, 80), (112, 176), (1, 1), (1, 200), (1, 201), (3, 600), (7, 1500),
             (1080, 1920), (4000, 3000), (4096, 4096), (10000, 50), (37, 53), (9, 13), (150, 210),
             (16, 16), (33, 31), (6000, 6000), (224, 224), (479, 641)]
    for factor, lo, hi in bounds:
        for h, w in sizes:
            try:
                rh, rw = smart_resize(h, w, factor, lo, hi)
                cases.append({"height": h, "width": w, "factor": factor, "min_pixels": lo, "max_pixels": hi,
                              "resized_height": rh, "resized_width": rw})
            except ValueError:
                cases.append({"height": h, "width": w, "factor": factor, "min_pixels": lo, "max_pixels": hi,
                              "error": True})
    with open(os.path.join(out, "smart_resize.json"), "w") as f:
        json.dump(cases, f)


if __name__ == "__main__":
    main()

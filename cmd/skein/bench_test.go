package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/skein-ai/skein/engine"
)

// benchJSON runs `skein bench engine --json` with tiny sizes on a fresh tiny model of arch and
// returns the JSON object it printed.
func benchJSON(t *testing.T, arch engine.Arch, extra ...string) map[string]any {
	t.Helper()
	dir := t.TempDir()
	if err := engine.InitTiny(dir, arch, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	old := benchOutput
	benchOutput = &out
	defer func() { benchOutput = old }()
	args := append([]string{"bench", "engine", "--model", dir, "--json", "--batch", "1", "--seq", "64",
		"--steps", "1", "--decode", "2", "--peak-size", "64", "--images", "2"}, extra...)
	if err := run(args); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	var res map[string]any
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("output %q: %v", out.String(), err)
	}
	return res
}

var visionBenchKeys = []string{"vision_images_per_s", "train_tokens_per_s_images"}

// On a vision-language model the bench also times the vision tower alone and training on
// sequences that each hold an image; on a text model it reports neither. The VL run's 256
// random text tokens would hold the image pad token (which needs pixels) if it were drawn.
func TestBenchEngineReportsVisionKeysOnlyForVLModels(t *testing.T) {
	vl := benchJSON(t, engine.ArchQwen3VL, "--seq", "256")
	for _, k := range append([]string{"train_tokens_per_s"}, visionBenchKeys...) {
		if v, ok := vl[k].(float64); !ok || !(v > 0) {
			t.Errorf("VL model: %s = %v, want a positive number", k, vl[k])
		}
	}
	text := benchJSON(t, engine.ArchQwen3)
	if v, ok := text["train_tokens_per_s"].(float64); !ok || !(v > 0) {
		t.Errorf("text model: train_tokens_per_s = %v", text["train_tokens_per_s"])
	}
	for _, k := range visionBenchKeys {
		if _, ok := text[k]; ok {
			t.Errorf("text model reports %s = %v", k, text[k])
		}
	}
}

// A sequence too short for the bench's image is refused with a message naming --seq, and an
// image below one merge block of patches is refused, before any training.
func TestBenchEngineRefusesImagesThatDoNotFit(t *testing.T) {
	dir := t.TempDir()
	if err := engine.InitTiny(dir, engine.ArchQwen3VL, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	old := benchOutput
	benchOutput = &bytes.Buffer{}
	defer func() { benchOutput = old }()
	for flag, args := range map[string][]string{
		"--seq":       {"--seq", "16"},
		"bench image": {"--image-side", "8"},
		"--images":    {"--images", "0"},
		"--peak-size": {"--peak-size", "0"},
	} {
		err := run(append([]string{"bench", "engine", "--model", dir, "--json", "--batch", "1", "--steps", "1",
			"--decode", "2", "--peak-size", "64"}, args...))
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%v: error %v, want one naming %s", args, err, flag)
		}
	}
}

// SKEIN_GEMM forces a kernel path: the bench reports the path it ran (gemm_path), the paths the
// CPU has (gemm_paths) and the first step's loss, which the forced scalar path reproduces within
// float32 rounding of the best path's. A path the CPU lacks, or a name that is no path, is a
// clear error before any work.
func TestBenchEngineReportsAndForcesTheKernelPath(t *testing.T) {
	best := benchJSON(t, engine.ArchQwen3)
	paths, _ := best["gemm_paths"].([]any)
	if len(paths) == 0 {
		t.Fatalf("gemm_paths %v", best["gemm_paths"])
	}
	// What auto chooses, unless the environment forces one: the best path (AMX included), which
	// the start-up check keeps unless its kernels disagree with their models.
	want := best["gemm_default"]
	if !slices.Contains(paths, want) || want != paths[len(paths)-1] {
		t.Fatalf("gemm_default %v, gemm_paths %v: want the last, the best", want, paths)
	}
	if v := os.Getenv("SKEIN_GEMM"); v != "" {
		want = v
	}
	if best["gemm_path"] != want {
		t.Fatalf("gemm_path %v, gemm_paths %v: want %v", best["gemm_path"], best["gemm_paths"], want)
	}
	t.Setenv("SKEIN_GEMM", "scalar")
	t.Cleanup(func() { _, _ = engine.UseKernelPath("auto") })
	scalar := benchJSON(t, engine.ArchQwen3)
	if scalar["gemm_path"] != "scalar" {
		t.Fatalf("SKEIN_GEMM=scalar ran %v", scalar["gemm_path"])
	}
	l0, l1 := best["first_loss"].(float64), scalar["first_loss"].(float64)
	if !(l0 > 0) || math.Abs(l0-l1) > 1e-4*l0 {
		t.Fatalf("first_loss %v on %v, %v on scalar", l0, best["gemm_path"], l1)
	}
	for _, bad := range []string{"sse9", "amx"} {
		if bad == "amx" && slices.Contains(paths, any("amx")) {
			continue
		}
		t.Setenv("SKEIN_GEMM", bad)
		err := run([]string{"bench", "engine", "--model", t.TempDir(), "--json"})
		if err == nil || !strings.Contains(err.Error(), "SKEIN_GEMM="+bad) {
			t.Fatalf("SKEIN_GEMM=%s: error %v, want one naming it", bad, err)
		}
	}
}

// The training-only bench reports loading apart from training: its seconds and its peak
// resident memory, which holds at least the weights it loaded; where the peak could be reset
// (Linux), training's peak is measured from there and still holds the weights.
func TestBenchEngineReportsLoadingApart(t *testing.T) {
	res := benchJSON(t, engine.ArchQwen3, "--train-only")
	num := func(k string) float64 {
		v, ok := res[k].(float64)
		if !ok {
			t.Fatalf("%s = %v, want a number (%v)", k, res[k], res)
		}
		return v
	}
	weights := num("weights_mb")
	if load := num("load_rss_mb"); !(load >= weights) || !(num("load_s") > 0) {
		t.Fatalf("load_rss_mb %v for %v MB of weights, load_s %v", load, weights, res["load_s"])
	}
	if num("rss_reset") == 1 && !(num("train_rss_mb") >= weights) {
		t.Fatalf("train_rss_mb %v after the reset, below the %v MB of weights", res["train_rss_mb"], weights)
	}
	if peak := num("peak_rss_mb"); peak != max(num("load_rss_mb"), num("train_rss_mb")) {
		t.Fatalf("peak_rss_mb %v, want the process's: the larger of load_rss_mb %v and train_rss_mb %v", peak, res["load_rss_mb"], res["train_rss_mb"])
	}
}

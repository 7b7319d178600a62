package engine

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/skein-ai/skein/safetensors"
)

// expertProj maps Tinker's names of an expert's projections to the module names of the base
// model's checkpoint (the cookbook's expert_key_remaps).
var expertProj = map[string]string{"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}

// ExportAdapterPEFT writes the adapter saved in adapterDir (skein's files, which are Tinker's)
// to outDir as a PEFT adapter that Hugging Face PEFT and vLLM load over the base model as its
// per-expert modules are named: a mixture of experts' shared-outer LoRAs expanded to every
// expert's own gate_proj, up_proj and down_proj (expert e: gate's A shared, its B the e-th block;
// down's A the e-th block, its B shared), as the cookbook's build_lora_adapter does. Other
// modules are copied as they are. The expanded file holds E copies of each shared factor: for
// Qwen3-30B-A3B at rank 32, 3.2 GB of float32 where the adapter is 1.9 GB.
func ExportAdapterPEFT(adapterDir string, base *Config, outDir string) error {
	lc, err := ReadAdapterConfig(adapterDir)
	if err != nil {
		return fmt.Errorf("engine: reading adapter: %w", err)
	}
	if lc.Rank < 1 || lc.Rank > 1<<16 {
		return fmt.Errorf("engine: adapter rank %d is out of range", lc.Rank)
	}
	mods := base.loraModules(lc.spec())
	if len(mods) == 0 {
		return fmt.Errorf("engine: the adapter in %s adapts no module", adapterDir)
	}
	r := lc.Rank
	want := map[string][]int{}
	for _, m := range mods {
		want["base_model.model."+m.Path+".lora_A.weight"] = m.aFile(r)
		want["base_model.model."+m.Path+".lora_B.weight"] = m.bFile(r)
	}
	tensors, err := readTensors(filepath.Join(adapterDir, AdapterWeightsFile), want, nil)
	if err != nil {
		return fmt.Errorf("engine: reading adapter %s: %w", adapterDir, err)
	}
	out := map[string]safetensors.Tensor{}
	targets := map[string]bool{}
	put := func(path string, a []float64, ashape []int, b []float64, bshape []int) {
		out["base_model.model."+path+".lora_A.weight"] = safetensors.FromFloat32(narrow(a), ashape...)
		out["base_model.model."+path+".lora_B.weight"] = safetensors.FromFloat32(narrow(b), bshape...)
		targets[path[strings.LastIndex(path, ".")+1:]] = true
	}
	for _, m := range mods {
		a, b := tensors["base_model.model."+m.Path+".lora_A.weight"], tensors["base_model.model."+m.Path+".lora_B.weight"]
		if m.Experts == 0 {
			put(m.Path, a, m.aShape(r), b, m.bShape(r))
			continue
		}
		prefix, name, _ := cutLast(m.Path, ".")
		for e := range m.Experts {
			path := prefix + "." + strconv.Itoa(e) + "." + expertProj[name]
			if m.ExpertA { // down: A_e [r, I], B [D, r] shared
				n := r * m.In
				put(path, a[e*n:(e+1)*n], []int{r, m.In}, b, []int{m.Out, r})
				continue
			}
			I := m.Out / m.Experts // gate, up: A [r, D] shared, B_e [I, r]
			put(path, a, []int{r, m.In}, b[e*I*r:(e+1)*I*r], []int{I, r})
		}
	}
	var tm []string
	for t := range targets {
		tm = append(tm, t)
	}
	sort.Strings(tm)
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	pc := peftConfig{PeftType: "LORA", TaskType: "CAUSAL_LM", R: r, LoraAlpha: lc.Alpha, TargetModules: tm, Bias: "none",
		InferenceMode: true, InitLoraWeights: true, SkeinSeed: lc.Seed}
	if err := safetensors.WriteFile(filepath.Join(outDir, AdapterWeightsFile), out, map[string]string{"format": "pt"}); err != nil {
		return err
	}
	cb, _ := json.MarshalIndent(pc, "", "  ")
	return writeFileAtomic(filepath.Join(outDir, AdapterConfigFile), cb)
}

func narrow(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// cutLast splits s around its last sep.
func cutLast(s, sep string) (before, after string, found bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

package engine

import (
	"fmt"
	"slices"
	"strings"
)

// family is one model architecture: how its config.json names it and what it adds to the shared
// decoder layer (transformer.go). Each family lives in its own arch_*.go file and registers
// itself, so adding one touches no other.
type family struct {
	arch      Arch
	hfClass   string // config.json "architectures"[0], e.g. "LlamaForCausalLM"
	modelType string // config.json "model_type"
	// headNorm: RMSNorm on every query and key head before RoPE (weights q_norm, k_norm).
	headNorm bool
	// finish applies what the family fixes regardless of config.json (nil: nothing).
	finish func(c *Config)
	// statedRopeTheta: config.json must give rope_theta (HF's default is not what its checkpoints use).
	statedRopeTheta bool
	// tinyConfig sets the family's own keys of a generated model's config.json.
	tinyConfig func(cfg map[string]any, p Preset)
	// validate checks what the family adds to config.json (nil: nothing).
	validate func(c *Config) error
	// lmPrefix is the HF name prefix of the LM's weights ("" : "model.").
	lmPrefix string
	// extraWeights lists weights beside the LM's (a vision tower's), with their HF shapes.
	extraWeights func(c *Config) []string
	extraShape   func(c *Config, name string) []int
	// A generated model's special tokens beside SpecialTokens, how the config names their ids,
	// and the files it has beside config, weights and tokenizer (nil: none).
	tinySpecials []string
	tinyTokens   func(cfg map[string]any, id func(string) int)
	tinyFiles    func(dir string, c *Config) error
}

var families = map[Arch]*family{}

// registerFamily adds an architecture; called from the init of its file.
func registerFamily(f *family) {
	if _, dup := families[f.arch]; dup {
		panic("engine: architecture registered twice: " + string(f.arch))
	}
	families[f.arch] = f
}

// familyOf finds the family of a config: by its architecture class first, then by model_type.
func familyOf(hfClass, modelType string) (*family, error) {
	for _, f := range families {
		if hfClass != "" && f.hfClass == hfClass {
			return f, nil
		}
	}
	for _, f := range families {
		if f.modelType == modelType {
			return f, nil
		}
	}
	return nil, fmt.Errorf("unsupported architecture %q (model_type %q); supported: %s", hfClass, modelType, strings.Join(familyNames(), ", "))
}

func familyNames() []string {
	var names []string
	for a := range families {
		names = append(names, string(a))
	}
	slices.Sort(names)
	return names
}

// family is the config's architecture (set by finish); a config never finished gets the plain
// layer.
func (c *Config) family() *family {
	if f := families[c.Arch]; f != nil {
		return f
	}
	return &family{arch: c.Arch}
}

// lm is the HF name prefix of the LM's weights and modules: "model." for causal LMs,
// "model.language_model." inside a vision-language model.
func (c *Config) lm() string {
	if p := c.family().lmPrefix; p != "" {
		return p
	}
	return "model."
}

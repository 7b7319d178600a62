package engine

import (
	"fmt"
	"slices"
	"strings"
)

// family is one model architecture: how its config.json names it and what it adds to the shared
// decoder layer (transformer.go). Each family lives in its own arch_*.go file and registers
// itself, so adding one touches no other. A family that does more than these fields say
// implements the optional interfaces below, found by a type assertion on what it registered
// (Config.architecture); tiny.go's tinyFamily makes it one InitTiny can generate.
type family struct {
	arch      Arch
	hfClass   string // config.json "architectures"[0], e.g. "LlamaForCausalLM"
	modelType string // config.json "model_type"
	// headNorm: RMSNorm on every query and key head before RoPE (weights q_norm, k_norm).
	headNorm bool
	// statedRopeTheta: config.json must give rope_theta (HF's default is not what its checkpoints use).
	statedRopeTheta bool
	// lmPrefix is the HF name prefix of the LM's weights ("" : "model.").
	lmPrefix string
	// zeroCentredNorms: the checkpoint's RMSNorm weights w multiply as (1 + w) (Qwen3.5); the
	// loader adds the 1, so the layers multiply by the stored weight as everywhere else.
	zeroCentredNorms bool
	// gatedAttention: q_proj gives each head its queries and then as many gate rows, and the
	// attention output is multiplied by σ(gate) before o_proj (Qwen3.5).
	gatedAttention bool
}

// architecture is what an arch_*.go file registers: a type that embeds its family, with the
// methods of whichever optional interfaces it needs.
type architecture interface {
	desc() *family
}

func (f *family) desc() *family { return f }

// finisher is a family that fixes part of the config regardless of config.json.
type finisher interface {
	finish(c *Config)
}

// validator is a family that checks what it adds to config.json.
type validator interface {
	validate(c *Config) error
}

// extraWeighter is a family with weights beside the LM's (a vision tower's).
type extraWeighter interface {
	extraWeights(c *Config) []string
	// extraShape is the HF shape of one of them (nil: name is not one of its weights).
	extraShape(c *Config, name string) []int
}

var families = map[Arch]architecture{}

// registerFamily adds an architecture; called from the init of its file.
func registerFamily(a architecture) {
	f := a.desc()
	if _, dup := families[f.arch]; dup {
		panic("engine: architecture registered twice: " + string(f.arch))
	}
	families[f.arch] = a
}

// familyOf finds the family of a config: by its architecture class first, then by model_type.
func familyOf(hfClass, modelType string) (architecture, error) {
	// A stated class decides: a supported family's other heads (…ForSequenceClassification,
	// …ForTokenClassification) share its model_type but are not causal LMs, and loading one
	// as a causal LM would serve nonsense without a word. model_type decides only where
	// config.json names no class.
	if hfClass != "" {
		for _, a := range families {
			if a.desc().hfClass == hfClass {
				return a, nil
			}
		}
		return nil, fmt.Errorf("unsupported architecture %q (model_type %q): skein serves these causal LMs: %s",
			hfClass, modelType, strings.Join(familyClasses(), ", "))
	}
	for _, a := range families {
		if a.desc().modelType == modelType {
			return a, nil
		}
	}
	return nil, fmt.Errorf("unsupported model_type %q (config.json names no architecture); supported: %s", modelType, strings.Join(familyClasses(), ", "))
}

// familyClasses is the supported config.json classes, with their model_type, sorted.
func familyClasses() []string {
	var names []string
	for _, a := range families {
		names = append(names, fmt.Sprintf("%s (%s)", a.desc().hfClass, a.desc().modelType))
	}
	slices.Sort(names)
	return names
}

func familyNames() []string {
	var names []string
	for a := range families {
		names = append(names, string(a))
	}
	slices.Sort(names)
	return names
}

// architecture is the config's registered architecture (set by finish); a config never
// finished gets the plain layer.
func (c *Config) architecture() architecture {
	if a := families[c.Arch]; a != nil {
		return a
	}
	return &family{arch: c.Arch}
}

// family is the config's family: its architecture's description.
func (c *Config) family() *family { return c.architecture().desc() }

// lm is the HF name prefix of the LM's weights and modules: "model." for causal LMs,
// "model.language_model." inside a vision-language model.
func (c *Config) lm() string {
	if p := c.family().lmPrefix; p != "" {
		return p
	}
	return "model."
}

// Package checkpoint names and lays out saved adapters: tinker:// paths and the directories
// behind them. It is a leaf package.
package checkpoint

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
)

// Kinds of checkpoint, as they appear in paths.
const (
	KindWeights        = "weights"         // training state: weights + optimizer
	KindSamplerWeights = "sampler_weights" // weights only
)

// Path is a parsed tinker://<model_id>/<kind>/<name>.
type Path struct {
	ModelID, Kind, Name string
}

// String renders the canonical tinker:// form.
func (p Path) String() string { return "tinker://" + p.ModelID + "/" + p.Kind + "/" + p.Name }

// ID is the checkpoint id used by the REST API: "<kind>/<name>".
func (p Path) ID() string { return p.Kind + "/" + p.Name }

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidName reports whether a checkpoint name is safe as one path element.
func ValidName(name string) error {
	if !namePattern.MatchString(name) || strings.Contains(name, "..") {
		return fmt.Errorf("checkpoint name %q: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// Parse reads tinker://model/kind/name (twinkle:// accepted too).
func Parse(s string) (Path, error) {
	rest, ok := strings.CutPrefix(s, "tinker://")
	if !ok {
		rest, ok = strings.CutPrefix(s, "twinkle://")
	}
	if !ok {
		return Path{}, fmt.Errorf("checkpoint path %q must start with tinker://", s)
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 || parts[0] == "" {
		return Path{}, fmt.Errorf("checkpoint path %q must be tinker://<model_id>/weights|sampler_weights/<name>", s)
	}
	p := Path{ModelID: parts[0], Kind: parts[1], Name: parts[2]}
	if p.Kind != KindWeights && p.Kind != KindSamplerWeights {
		return Path{}, fmt.Errorf("checkpoint path %q: kind must be weights or sampler_weights", s)
	}
	if err := ValidName(p.Name); err != nil {
		return Path{}, err
	}
	if strings.ContainsAny(p.ModelID, `/\`) || p.ModelID == "." || p.ModelID == ".." {
		return Path{}, fmt.Errorf("checkpoint path %q: bad model id", s)
	}
	return p, nil
}

// Dir is where a checkpoint lives under the data directory.
func (p Path) Dir(root string) string {
	return filepath.Join(root, "checkpoints", safe(p.ModelID), p.Kind, p.Name)
}

// safe maps a model id (which contains ':') to a portable directory name.
func safe(id string) string { return strings.ReplaceAll(id, ":", "_") }

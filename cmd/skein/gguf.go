package main

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/skein-ai/skein/engine"
)

// skein model to-gguf and skein model export-gguf: GGUF files for llama.cpp and Ollama.

// toGGUF writes a Hugging Face model directory as one GGUF file.
func toGGUF(args []string) error {
	fs := flag.NewFlagSet("to-gguf", flag.ContinueOnError)
	typ := fs.String("type", "f16", "tensor type of the projections: "+strings.Join(ggufTypeNames(), ", "))
	name := fs.String("name", "", "general.name (default: the directory's name)")
	const synopsis = "skein model to-gguf DIR OUT.gguf [--type f32|f16|bf16|q8_0|q4_k|q6_k|q4_k_m] [--name NAME]"
	pos, err := parseArgs(fs, args, synopsis)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return errors.New("usage: " + synopsis)
	}
	t, ok := engine.GGUFTypes[*typ]
	if !ok {
		return fmt.Errorf("--type %q: one of %s", *typ, strings.Join(ggufTypeNames(), ", "))
	}
	dir, resolved, err := resolveModel(pos[0])
	if err != nil {
		return err
	}
	if *name == "" {
		*name = resolved
	}
	if err := engine.WriteGGUF(dir, pos[1], t, *name); err != nil {
		return err
	}
	fmt.Printf("wrote %s (%s) to %s\n", *name, *typ, pos[1])
	return nil
}

func ggufTypeNames() []string {
	var names []string
	for n := range engine.GGUFTypes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// exportGGUF writes a saved adapter (a checkpoint directory of PEFT files) as a llama.cpp LoRA
// adapter for the base model it was trained on.
// exportPEFT writes a checkpoint as a PEFT adapter with a mixture of experts' LoRAs expanded onto
// each expert's modules (engine.ExportAdapterPEFT), the form vLLM and PEFT load.
func exportPEFT(args []string) error {
	fs := flag.NewFlagSet("export-peft", flag.ContinueOnError)
	base := fs.String("base", "", "the base model the adapter was trained on: its Hugging Face directory")
	const synopsis = "skein model export-peft CHECKPOINT_DIR OUT_DIR --base MODEL"
	pos, err := parseArgs(fs, args, synopsis)
	if err != nil {
		return err
	}
	if len(pos) != 2 || *base == "" {
		return errors.New("usage: " + synopsis)
	}
	path, _, err := resolveModel(*base)
	if err != nil {
		return err
	}
	cfg, err := engine.LoadModelConfig(path)
	if err != nil {
		return err
	}
	if err := engine.ExportAdapterPEFT(filepath.Clean(pos[0]), cfg, pos[1]); err != nil {
		return err
	}
	fmt.Printf("wrote the adapter in %s to %s as PEFT, experts expanded\n", pos[0], pos[1])
	return nil
}

func exportGGUF(args []string) error {
	fs := flag.NewFlagSet("export-gguf", flag.ContinueOnError)
	base := fs.String("base", "", "the base model the adapter was trained on: its Hugging Face directory or GGUF file")
	const synopsis = "skein model export-gguf CHECKPOINT_DIR OUT.gguf --base MODEL"
	pos, err := parseArgs(fs, args, synopsis)
	if err != nil {
		return err
	}
	if len(pos) != 2 || *base == "" {
		return errors.New("usage: " + synopsis)
	}
	path := *base
	if !engine.IsGGUF(path) {
		if path, _, err = resolveModel(path); err != nil {
			return err
		}
	}
	cfg, err := engine.LoadModelConfig(path)
	if err != nil {
		return err
	}
	if err := engine.ExportAdapterGGUF(filepath.Clean(pos[0]), cfg, pos[1]); err != nil {
		return err
	}
	fmt.Printf("wrote the adapter in %s to %s (for a Modelfile: FROM <the base>, ADAPTER %s)\n", pos[0], pos[1], pos[1])
	return nil
}

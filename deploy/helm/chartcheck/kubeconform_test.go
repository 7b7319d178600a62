package chartcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// kubeconformEnv names the directory scripts/kubeconform.sh prints: the kubeconform binary and
// schemas/v1.37.2-standalone-strict.
const kubeconformEnv = "SKEIN_KUBECONFORM"

type kubeconformResult struct {
	Filename string `json:"filename"`
	Kind     string `json:"kind"`
	Name     string `json:"name"`
	Status   string `json:"status"`
	Msg      string `json:"msg"`
}

// kubeconform writes docs as one file, as `helm template` prints them, and validates it with
// `kubeconform -strict` against the offline schemas; it returns one result per document (-verbose:
// valid ones too).
func kubeconform(t *testing.T, dir string, docs []string) []kubeconformResult {
	t.Helper()
	file := filepath.Join(t.TempDir(), "rendered.yaml")
	if err := os.WriteFile(file, []byte(strings.Join(docs, "\n---\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	loc := filepath.Join(dir, "schemas") + "/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json"
	cmd := exec.Command(filepath.Join(dir, "kubeconform"), "-strict", "-verbose", "-kubernetes-version", "1.37.2",
		"-schema-location", loc, "-output", "json", file)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var out struct {
		Resources []kubeconformResult `json:"resources"`
	}
	if jerr := json.Unmarshal(stdout.Bytes(), &out); jerr != nil {
		t.Fatalf("kubeconform (%v): %v\n%s%s", err, jerr, stdout.String(), stderr.String())
	}
	return out.Resources
}

// Every manifest the chart renders (two pools with every option, and the defaults with a shared
// volume) is valid for Kubernetes 1.37.2's schemas with no field they do not list; and a manifest
// with an unknown field, or a string where a port number goes, is refused, so the check can fail.
func TestChartPassesKubeconform(t *testing.T) {
	dir := os.Getenv(kubeconformEnv)
	if dir == "" {
		t.Skipf("%s unset: set it to the directory scripts/kubeconform.sh prints", kubeconformEnv)
	}
	for name, overrides := range map[string]map[string]any{
		"two pools":   twoPools,
		"shared data": {"postgres": map[string]any{"existingSecret": "pg"}, "sharedData": map[string]any{"existingClaim": "skein-data"}},
	} {
		t.Run(name, func(t *testing.T) {
			out, _, err := Render(overrides, nil)
			if err != nil {
				t.Fatal(err)
			}
			docs := Documents(out)
			res := kubeconform(t, dir, docs)
			if len(res) != len(docs) {
				t.Fatalf("kubeconform saw %d resources in %d documents: %+v", len(res), len(docs), res)
			}
			for _, r := range res {
				if r.Status != "statusValid" {
					t.Errorf("%s %s: %s %s", r.Kind, r.Name, r.Status, r.Msg)
				}
			}
		})
	}
	t.Run("refusals", func(t *testing.T) {
		out, _, err := Render(twoPools, nil)
		if err != nil {
			t.Fatal(err)
		}
		var deployment, service string
		for _, d := range Documents(out) {
			switch {
			case strings.Contains(d, "kind: Deployment") && strings.Contains(d, "name: skein-worker-qwen3-8b"):
				deployment = d
			case strings.Contains(d, "kind: Service\n") && strings.Contains(d, "name: skein-worker-qwen3-8b"):
				service = d
			}
		}
		bad := []string{
			replaceOnce(t, deployment, "readOnlyRootFilesystem: true", "readOnlyRootFilesytem: true"),
			replaceOnce(t, service, "port: 8001", "port: eighty"),
		}
		res := kubeconform(t, dir, bad)
		want := map[string]string{ // by kind: kubeconform's results come in no set order
			"Deployment": "additional properties 'readOnlyRootFilesytem' not allowed",
			"Service":    "at '/spec/ports/0/port': got string, want integer",
		}
		if len(res) != len(want) {
			t.Fatalf("results %+v", res)
		}
		for _, r := range res {
			if r.Status != "statusInvalid" || want[r.Kind] == "" || !strings.Contains(r.Msg, want[r.Kind]) {
				t.Errorf("%s %s: %s %q, want invalid: %q", r.Kind, r.Name, r.Status, r.Msg, want[r.Kind])
			}
		}
	})
}

func replaceOnce(t *testing.T, doc, from, to string) string {
	t.Helper()
	if !strings.Contains(doc, from) {
		t.Fatal(fmt.Sprintf("%q not in %.200q", from, doc))
	}
	return strings.Replace(doc, from, to, 1)
}

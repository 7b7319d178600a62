package checkpoint

import (
	"os"
	"path/filepath"
	"testing"
)

// A crash at any point of an overwrite leaves, after Recover, the old checkpoint or the new one,
// complete, never neither, and no temporary directory.
func TestOverwriteSurvivesACrashAtEveryStep(t *testing.T) {
	for _, step := range []string{"", "aside", "renamed"} {
		t.Run("crash after "+step, func(t *testing.T) {
			root := t.TempDir()
			kindDir := filepath.Join(root, "tenant_train_0", KindWeights)
			dir := filepath.Join(kindDir, "ckpt")
			write := func(d, content string) {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
				for _, f := range []string{"adapter_model.safetensors", "adapter_config.json"} {
					if err := os.WriteFile(filepath.Join(d, f), []byte(content+f), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			write(dir, "old")
			tmp := dir + PartialMark + "abcd"
			write(tmp, "new")
			crashAfter = func(s string) bool { return s == step }
			defer func() { crashAfter = nil }()
			err := Replace(tmp, dir)
			if step == "" && err != nil {
				t.Fatal(err)
			}
			crashAfter = nil
			if _, err := Recover(root, true); err != nil {
				t.Fatal(err)
			}
			got := ""
			for _, f := range []string{"adapter_model.safetensors", "adapter_config.json"} {
				b, err := os.ReadFile(filepath.Join(dir, f))
				if err != nil {
					t.Fatalf("after a crash after %q the checkpoint is not loadable: %v", step, err)
				}
				if got != "" && string(b)[:3] != got {
					t.Fatalf("a mix of old and new files: %q", b)
				}
				got = string(b)[:3]
			}
			want := map[string]string{"": "new", "aside": "old", "renamed": "new"}[step]
			if got != want {
				t.Fatalf("after a crash after %q: %s checkpoint, want the %s one", step, got, want)
			}
			entries, _ := os.ReadDir(kindDir)
			if len(entries) != 1 {
				var names []string
				for _, e := range entries {
					names = append(names, e.Name())
				}
				t.Fatalf("left behind: %v", names)
			}
		})
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// Every flag line of every --help names the flag and at most a one-word placeholder: a usage
// text with backquotes makes Go's flag package take the quoted words as the placeholder
// (`--model skein model init-tiny --preset small`), which reads as nonsense (issue 22).
func TestHelpPlaceholdersAreOneWord(t *testing.T) {
	line := regexp.MustCompile(`^  --[a-z0-9-]+( [a-zA-Z0-9_.]+)?$`)
	for _, args := range [][]string{{"serve", "--help"}, {"worker", "--help"}, {"model", "init-tiny", "--help"},
		{"bench", "engine", "--help"}, {"keys", "create", "--help"}} {
		out, err := captureOutput(t, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "  --") && !line.MatchString(l) {
				t.Errorf("%v: flag line %q", args, l)
			}
		}
	}
}

// A binary built without GOEXPERIMENT=simd runs the engine's scalar loops, about 12× slower on
// amd64: serve, worker and bench say so at start-up, with how to rebuild; a SIMD build, or an
// architecture without the vector kernels, says nothing (issue 22).
func TestWarnsWhenBuiltWithoutSIMD(t *testing.T) {
	msg := simdWarning(false, "amd64")
	if !strings.Contains(msg, "GOEXPERIMENT=simd") || !strings.Contains(msg, "slower") {
		t.Errorf("warning %q does not say what is wrong and how to fix it", msg)
	}
	for _, quiet := range []struct {
		built bool
		arch  string
	}{{true, "amd64"}, {false, "arm64"}, {true, "arm64"}} {
		if m := simdWarning(quiet.built, quiet.arch); m != "" {
			t.Errorf("simd %v on %s: warns %q", quiet.built, quiet.arch, m)
		}
	}
	var b bytes.Buffer
	warnSIMD(slog.New(slog.NewJSONHandler(&b, nil)), false, "amd64")
	if !strings.Contains(b.String(), `"level":"WARN"`) || !strings.Contains(b.String(), "GOEXPERIMENT=simd") {
		t.Errorf("logged %q", b.String())
	}
}

// With --log-format json every line `skein serve` writes to its log is a JSON object: the
// lines of packages that log through slog's default logger (a replica reloading an adapter
// after a restart), the generated cluster token's message, a deprecated flag's note and the
// final error (issue 22).
func TestJSONLogHasOnlyJSONLines(t *testing.T) {
	data, logs := t.TempDir(), t.TempDir()
	addr := freeAddr(t)
	args := []string{"serve", "--data", data, "--addr", addr, "--log-format", "json", "--accept-workers", "--tenant-max-loras", "8"}
	srv := startSkein(t, logs, args...)
	waitHealthy(t, addr)
	ctx := context.Background()
	c := client.New("http://"+addr, "tml-json")
	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, "tiny-qwen3", 4)
	if err != nil {
		t.Fatal(err)
	}
	batch := []api.Datum{datum([]int{10, 20, 30, 40, 50, 60, 70, 80, 90})}
	trainStep(t, ctx, tc, batch)
	_ = srv.Process.Signal(syscall.SIGKILL)
	_, _ = srv.Process.Wait()
	srv = startSkein(t, logs, args...)
	waitHealthy(t, addr)
	trainStep(t, ctx, tc, batch) // the adapter reloads from its saved state
	_ = srv.Process.Signal(syscall.SIGTERM)
	_, _ = srv.Process.Wait()
	// A start that fails: its error is a JSON line too.
	bad := exec.Command(os.Args[0], "serve", "--data", data, "--addr", addr, "--log-format", "json", "--model", filepath.Join(data, "missing"))
	bad.Env = append(os.Environ(), "SKEIN_TEST_RUN_AS_SKEIN=1")
	badOut, _ := bad.CombinedOutput()
	_ = os.WriteFile(filepath.Join(logs, "failed.log"), badOut, 0o644)

	files, _ := filepath.Glob(filepath.Join(logs, "*.log"))
	var lines int
	var sawReload, sawToken, sawError, sawDeprecated bool
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var rec map[string]any
			if err := json.Unmarshal([]byte(l), &rec); err != nil {
				t.Errorf("%s: not a JSON line: %q", filepath.Base(f), l)
				continue
			}
			lines++
			msg, _ := rec["msg"].(string)
			sawReload = sawReload || strings.Contains(msg, "reloading adapter")
			sawToken = sawToken || strings.Contains(msg, "cluster token")
			sawDeprecated = sawDeprecated || strings.Contains(msg, "deprecated")
			sawError = sawError || rec["level"] == "ERROR" && strings.Contains(fmt.Sprint(rec), "missing")
		}
	}
	if lines == 0 || !sawReload || !sawToken || !sawError || !sawDeprecated {
		t.Errorf("%d lines; reload %v, token %v, final error %v, deprecated flag %v: the test did not reach the paths it checks",
			lines, sawReload, sawToken, sawError, sawDeprecated)
	}
}

// hfCache lays out a Hugging Face hub cache entry for org/name holding a tiny model, as
// huggingface_hub writes one: models--Org--Name/{refs/main, snapshots/<hash>/}; it returns the
// entry and its snapshot.
func hfCache(t *testing.T, repo string) (entry, snapshot string) {
	t.Helper()
	entry = filepath.Join(t.TempDir(), "hub", "models--"+strings.ReplaceAll(repo, "/", "--"))
	hash := "0123456789abcdef0123456789abcdef01234567"
	snapshot = filepath.Join(entry, "snapshots", hash)
	if err := engine.InitTiny(snapshot, engine.ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(entry, "refs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(entry, "refs", "main"), []byte(hash), 0o644); err != nil {
		t.Fatal(err)
	}
	return entry, snapshot
}

// --model accepts a Hugging Face cache entry (models--Org--Name) and serves the snapshot its
// refs/main points at as Org/Name; a snapshot directory is Org/Name too, not its hash. Saved
// adapters name that model as their base_model_name_or_path, not the server's directory. A
// refs/main that leads out of the entry or nowhere is an error saying so (issue 22).
func TestHuggingFaceCacheModelsAreNamedAsOnTheHub(t *testing.T) {
	entry, snapshot := hfCache(t, "Qwen/Qwen3-8B")
	for _, given := range []string{entry, entry + "/", snapshot} {
		dir, name, err := resolveModel(given)
		if err != nil || dir != snapshot || name != "Qwen/Qwen3-8B" {
			t.Errorf("%s: %s %q %v, want %s Qwen/Qwen3-8B", given, dir, name, err, snapshot)
		}
	}
	plain := t.TempDir()
	if dir, name, err := resolveModel(plain); err != nil || dir != plain || name != filepath.Base(plain) {
		t.Errorf("plain dir: %s %q %v", dir, name, err)
	}
	reps, err := loadReplicas(&serveConfig{Models: []string{entry}, Replicas: 1, MaxLoras: 1, StepMemoryMB: 64}, []string{entry}, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer reps[0].Close()
	if local, _ := reps[0].Local(); reps[0].BaseModel() != "Qwen/Qwen3-8B" || local.Dir != snapshot {
		t.Fatalf("served as %q from %s", reps[0].BaseModel(), local.Dir)
	}
	e, name, err := loadModel(entry, "", engine.Options{})
	if err != nil || name != "Qwen/Qwen3-8B" {
		t.Fatalf("loadModel: %q %v", name, err)
	}
	if _, err := e.CreateAdapter("a", engine.LoraConfig{Rank: 2, TrainAttn: true}); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := e.SaveAdapter(t.Context(), "a", out, false); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(out, engine.AdapterConfigFile))
	if !strings.Contains(string(b), `"base_model_name_or_path": "Qwen/Qwen3-8B"`) {
		t.Errorf("adapter_config.json: %s", b)
	}
	// --name still wins.
	if _, name, _ := loadModel(entry, "mine", engine.Options{}); name != "mine" {
		t.Errorf("--name: %q", name)
	}
	for _, ref := range []string{"../../../etc", "", "nothere", "a/../../x"} {
		if err := os.WriteFile(filepath.Join(entry, "refs", "main"), []byte(ref), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, err := resolveModel(entry); err == nil || !strings.Contains(err.Error(), "refs/main") {
			t.Errorf("refs/main %q: %v, want an error naming refs/main", ref, err)
		}
	}
}

// skein bench says what it is doing, one line per phase, since a full run on a big model takes
// minutes of silence otherwise; the model's load reports its progress (issue 22).
func TestBenchLogsEachPhase(t *testing.T) {
	var logs bytes.Buffer
	old := benchLog
	benchLog = &logs
	defer func() { benchLog = old }()
	benchJSON(t, engine.ArchQwen3, "--tenants", "2")
	for _, phase := range []string{"bench: matmul peak", "loading model", "model loaded", "bench: training",
		"bench: decoding", "bench: sampling across adapters", "bench: a sample while a forward_backward runs",
		"bench: training across adapters", "bench: done"} {
		if !strings.Contains(logs.String(), phase) {
			t.Errorf("no %q line in:\n%s", phase, logs.String())
		}
	}
}

// Every flag of the commands a person runs besides serve (whose flags are README's table, see
// TestReadmeFlagTable) appears in README's command list: a flag added to the binary and not to the
// README fails here.
func TestReadmeListsEveryCommandsFlags(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	flagName := regexp.MustCompile(`^  (--[a-z0-9-]+)`)
	for _, args := range [][]string{{"worker", "--help"}, {"model", "init-tiny", "--help"}, {"bench", "engine", "--help"},
		{"model", "to-gguf", "--help"}, {"model", "export-gguf", "--help"}, {"model", "export-peft", "--help"}} {
		out, err := captureOutput(t, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		n := 0
		for _, l := range strings.Split(out, "\n") {
			m := flagName.FindStringSubmatch(l)
			if m == nil || m[1] == "--help" || m[1] == "--config" || strings.HasPrefix(m[1], "--log-") {
				continue
			}
			n++
			if !strings.Contains(string(readme), "["+m[1]+" ") && !strings.Contains(string(readme), "["+m[1]+"]") && !strings.Contains(string(readme), " "+m[1]+" ") {
				t.Errorf("%v: README does not list %s", args[:len(args)-1], m[1])
			}
		}
		if n == 0 {
			t.Fatalf("%v: no flags in the help: %q", args, out)
		}
	}
}

// A Hugging Face name given to --model (Org/Name) that is no path here is looked up in the local
// hub cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub): found, it is
// served from its snapshot under that name (its refs/main, or its newest snapshot without one);
// not found, the error says that skein never downloads and where it looked (issue 40 item 18).
func TestAHubNameIsLookedUpInTheLocalCache(t *testing.T) {
	entry, snapshot := hfCache(t, "Qwen/Qwen3-8B")
	home := filepath.Dir(filepath.Dir(entry))
	t.Setenv("HF_HUB_CACHE", "")
	t.Setenv("HF_HOME", home)
	if dir, name, err := resolveModel("Qwen/Qwen3-8B"); err != nil || dir != snapshot || name != "Qwen/Qwen3-8B" {
		t.Fatalf("Qwen/Qwen3-8B: %s %q %v, want %s", dir, name, err, snapshot)
	}
	if err := os.Remove(filepath.Join(entry, "refs", "main")); err != nil {
		t.Fatal(err)
	}
	if dir, name, err := resolveModel("Qwen/Qwen3-8B"); err != nil || dir != snapshot || name != "Qwen/Qwen3-8B" {
		t.Fatalf("Qwen/Qwen3-8B without refs/main: %s %q %v, want %s", dir, name, err, snapshot)
	}
	t.Setenv("HF_HOME", "")
	t.Setenv("HF_HUB_CACHE", filepath.Join(home, "hub"))
	if dir, _, err := resolveModel("Qwen/Qwen3-8B"); err != nil || dir != snapshot {
		t.Fatalf("through HF_HUB_CACHE: %s %v", dir, err)
	}
	_, _, err := resolveModel("Qwen/Qwen3-32B")
	if err == nil || !strings.Contains(err.Error(), "never downloads") || !strings.Contains(err.Error(), filepath.Join(home, "hub")) ||
		!strings.Contains(err.Error(), "models--Qwen--Qwen3-32B") {
		t.Fatalf("a name in no cache: %v", err)
	}
	if _, _, err := loadModel("Qwen/Qwen3-32B", "", engine.Options{}); err == nil || !strings.Contains(err.Error(), "never downloads") {
		t.Fatalf("loadModel of a name in no cache: %v", err)
	}
}

// Without --json, skein bench says how far it got at every step (training steps, decoding
// batches, rounds across adapters), not only at each phase: on the 1b preset a phase is minutes
// long. With --json, only the phases are logged (issue 40 item 18).
func TestBenchPrintsProgressPerStep(t *testing.T) {
	dir := t.TempDir()
	if err := engine.InitTiny(dir, engine.ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	oldLog, oldOut := benchLog, benchOutput
	defer func() { benchLog, benchOutput = oldLog, oldOut }()
	for _, asJSON := range []bool{false, true} {
		var logs, out bytes.Buffer
		benchLog, benchOutput = &logs, &out
		args := []string{"bench", "engine", "--model", dir, "--batch", "1", "--seq", "32", "--steps", "2", "--decode", "2",
			"--peak-size", "32", "--tenants", "2"}
		if asJSON {
			args = append(args, "--json")
		}
		if err := run(args); err != nil {
			t.Fatal(err)
		}
		steps := strings.Count(logs.String(), "bench: training step")
		decodes := strings.Count(logs.String(), "bench: decoded")
		rounds := strings.Count(logs.String(), "bench: round")
		if asJSON && steps+decodes+rounds != 0 {
			t.Errorf("--json: %d step, %d decode and %d round lines:\n%s", steps, decodes, rounds, logs.String())
		}
		if !asJSON && (steps != 3 || decodes != 3 || rounds == 0) {
			t.Errorf("%d training step lines (want 3: the warm-up and 2), %d decoding lines (want 3), %d round lines:\n%s",
				steps, decodes, rounds, logs.String())
		}
	}
}

// readmeSection is the text of README.md from the heading that starts with title to the next
// heading of the same level or higher.
func readmeSection(t *testing.T, readme, title string) string {
	t.Helper()
	level := title[:strings.Index(title, " ")+1]
	i := strings.Index(readme, "\n"+title)
	if i < 0 {
		t.Fatalf("README.md has no %q section", title)
	}
	rest := readme[i+1+len(title):]
	heading := regexp.MustCompile(fmt.Sprintf(`^#{1,%d} `, len(level)-1))
	fenced, n := false, 0
	for _, line := range strings.SplitAfter(rest, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if !fenced && heading.MatchString(line) {
			return rest[:n]
		}
		n += len(line)
	}
	return rest
}

// What a new user runs from the README works as written (issue 40 item 18): the first lines say
// how to run the binary (./skein, or make install to put it on PATH, which the Makefile does);
// the quickstart says how to point the tinker SDK and CLI at skein and loads the tokenizer from
// the server, not from a path relative to where the server was started; the chat example bounds
// its answer; Troubleshooting's bench command is a modest one.
func TestReadmeFirstHour(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^install:`).Match(mk) || !strings.Contains(string(mk), "go install") || !strings.Contains(string(mk), "./cmd/skein") {
		t.Errorf("the Makefile has no install target running go install ./cmd/skein")
	}
	first := readme[:strings.Index(readme, "\n## ")]
	if !strings.Contains(first, "make install") || !strings.Contains(first, "./skein") {
		t.Errorf("README's first lines say neither ./skein nor make install:\n%s", first)
	}
	quick := readmeSection(t, readme, "## Quickstart")
	for _, want := range []string{"TINKER_BASE_URL", "TINKER_API_KEY", "/api/v1/models/"} {
		if !strings.Contains(quick, want) {
			t.Errorf("the quickstart does not mention %s", want)
		}
	}
	if strings.Contains(quick, `"skein-data/`) {
		t.Errorf("the quickstart still reads a path relative to the server's working directory")
	}
	chat := readmeSection(t, readme, "## Chat with an adapter")
	if !strings.Contains(chat, "max_tokens=") {
		t.Errorf("the chat example has no max_tokens")
	}
	trouble := readmeSection(t, readme, "### Troubleshooting")
	if !strings.Contains(trouble, "bench engine --model DIR --batch") || !strings.Contains(trouble, "--tenants 0") {
		t.Errorf("Troubleshooting's bench command is not the modest one:\n%s", trouble)
	}
}

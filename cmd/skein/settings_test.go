package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// twoValues are two different values for a flag, both different from its default unless the
// flag is a bool (then the second is the default): precedence is visible in which one wins.
func twoValues(t *testing.T, f *flag.Flag) (x, y []string) {
	t.Helper()
	if _, ok := f.Value.(*multiFlag); ok {
		return []string{"/x1", "/x2"}, []string{"/y"}
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		t.Fatalf("--%s: unknown flag type %T", f.Name, f.Value)
	}
	switch d := g.Get().(type) {
	case string:
		return []string{"x-" + f.Name}, []string{"y-" + f.Name}
	case int:
		return []string{fmt.Sprint(d + 7)}, []string{fmt.Sprint(d + 9)}
	case int64:
		return []string{fmt.Sprint(d + 7)}, []string{fmt.Sprint(d + 9)}
	case bool:
		return []string{fmt.Sprint(!d)}, []string{fmt.Sprint(d)}
	case time.Duration:
		return []string{(d + 7*time.Second).String()}, []string{(d + 9*time.Second).String()}
	}
	t.Fatalf("--%s: unknown value type %T", f.Name, g.Get())
	return nil, nil
}

// valueOf parses the settings into a new flag set and returns the flag's value.
func valueOf(t *testing.T, newFlags func() *flag.FlagSet, name string, args []string) string {
	t.Helper()
	fs := newFlags()
	if _, err := parseSettings(fs, args, "t"); err != nil {
		t.Fatalf("--%s: %v", name, err)
	}
	return fs.Lookup(name).Value.String()
}

// yamlFile writes `name: items` (a list for several) and returns its path.
func yamlFile(t *testing.T, name string, items []string) string {
	t.Helper()
	quoted := make([]string, len(items))
	for i, s := range items {
		quoted[i] = fmt.Sprintf("%q", s)
	}
	path := filepath.Join(t.TempDir(), "skein.yaml")
	body := fmt.Sprintf("%s: [%s]\n", name, strings.Join(quoted, ", "))
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func cliArgs(name string, items []string) []string {
	var args []string
	for _, s := range items {
		args = append(args, "--"+name+"="+s)
	}
	return args
}

// Every flag of serve, gateway and worker has a SKEIN_* variable and a YAML key that set it, in
// the order command line, variable, file, default.
func TestEveryFlagHasVariableAndYAMLKey(t *testing.T) {
	for cmd, newFlags := range map[string]func() *flag.FlagSet{
		"serve":  func() *flag.FlagSet { return first(serveFlags()) },
		"worker": func() *flag.FlagSet { return first(workerFlags()) },
	} {
		newFlags().VisitAll(func(f *flag.Flag) {
			if f.Name == "config" || strings.HasPrefix(f.Usage, deprecatedPrefix) {
				return // the file itself; aliases share their flag's value
			}
			t.Run(cmd+"/"+f.Name, func(t *testing.T) {
				clearSettingsEnv(t)
				x, y := twoValues(t, f)
				want := func(items []string) string {
					fs := newFlags()
					if err := setAll(fs, fs.Lookup(f.Name), items); err != nil {
						t.Fatal(err)
					}
					return fs.Lookup(f.Name).Value.String()
				}
				env := envName(f.Name)
				if got := valueOf(t, newFlags, f.Name, nil); got != f.DefValue {
					t.Fatalf("default: %q, want %q", got, f.DefValue)
				}
				// The file alone.
				cfg := []string{"--config", yamlFile(t, f.Name, x)}
				if got := valueOf(t, newFlags, f.Name, cfg); got != want(x) {
					t.Fatalf("YAML key %s: %q, want %q", f.Name, got, want(x))
				}
				// The variable beats the file.
				t.Setenv(env, strings.Join(y, ","))
				if got := valueOf(t, newFlags, f.Name, cfg); got != want(y) {
					t.Fatalf("%s with the file: %q, want %q", env, got, want(y))
				}
				// The command line beats the variable.
				t.Setenv(env, strings.Join(x, ","))
				if got := valueOf(t, newFlags, f.Name, cliArgs(f.Name, y)); got != want(y) {
					t.Fatalf("command line with %s: %q, want %q", env, got, want(y))
				}
				// The variable alone.
				if got := valueOf(t, newFlags, f.Name, nil); got != want(x) {
					t.Fatalf("%s: %q, want %q", env, got, want(x))
				}
			})
		})
	}
}

// The old name of the per-tenant adapter limit still works.
func TestDeprecatedTenantMaxLoras(t *testing.T) {
	clearSettingsEnv(t)
	t.Setenv("SKEIN_TENANT_MAX_LORAS", "")
	fs, c := serveFlags()
	if _, err := parseSettings(fs, []string{"--tenant-max-loras", "7"}, "t"); err != nil || c.MaxAdaptersPerTenant != 7 {
		t.Fatalf("--tenant-max-loras 7: %d, %v", c.MaxAdaptersPerTenant, err)
	}
	// The new name on the command line beats the old one's variable.
	t.Setenv("SKEIN_TENANT_MAX_LORAS", "5")
	fs, c = serveFlags()
	if _, err := parseSettings(fs, []string{"--max-adapters-per-tenant", "9"}, "t"); err != nil || c.MaxAdaptersPerTenant != 9 {
		t.Fatalf("--max-adapters-per-tenant 9 with SKEIN_TENANT_MAX_LORAS=5: %d, %v", c.MaxAdaptersPerTenant, err)
	}
}

// captureOutput runs run(args) and returns what it printed to stdout.
func captureOutput(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var b bytes.Buffer
	old := usageOutput
	usageOutput = &b
	defer func() { usageOutput = old }()
	err := run(args)
	return b.String(), err
}

// --help of every command succeeds and prints its usage; serve's lists every flag with its
// variable and default.
func TestHelpSucceeds(t *testing.T) {
	for _, args := range [][]string{{"serve", "--help"}, {"gateway", "-h"}, {"worker", "--help"},
		{"model", "init-tiny", "--help"}, {"model", "--help"}, {"bench", "engine", "--help"}, {"bench", "-h"},
		{"keys", "create", "--help"}, {"keys", "list", "-h"}, {"keys", "--help"}, {"--help"}} {
		out, err := captureOutput(t, args...)
		if err != nil || !strings.Contains(out, "usage") && !strings.Contains(out, "skein serve") {
			t.Errorf("%v: %v, printed %q", args, err, out)
		}
	}
	out, _ := captureOutput(t, "serve", "--help")
	fs, _ := serveFlags()
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(out, "--"+f.Name) || !strings.Contains(out, envName(f.Name)) {
			t.Errorf("serve --help does not list --%s with %s", f.Name, envName(f.Name))
		}
		if f.DefValue != "" && !strings.Contains(out, "default "+f.DefValue) {
			t.Errorf("serve --help does not give --%s's default %s", f.Name, f.DefValue)
		}
	})
}

// skein version and --version print the version set at build time.
func TestVersion(t *testing.T) {
	old := version
	version = "v0.0.0-test." + fmt.Sprint(time.Now().UnixNano())
	defer func() { version = old }()
	for _, arg := range []string{"version", "--version"} {
		out, err := captureOutput(t, arg)
		if err != nil || !strings.Contains(out, version) {
			t.Errorf("%s: %v, printed %q", arg, err, out)
		}
	}
}

// --log-format json writes JSON lines, --log-level drops the less severe ones, and bad values
// are refused.
func TestLogConfig(t *testing.T) {
	var b bytes.Buffer
	log, err := logConfig{Level: "warn", Format: "json"}.logger(&b)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("dropped")
	log.Warn("kept", "k", 1)
	if strings.Contains(b.String(), "dropped") || !strings.HasPrefix(b.String(), `{"time"`) || !strings.Contains(b.String(), `"msg":"kept"`) {
		t.Fatalf("log output %q", b.String())
	}
	for _, bad := range []logConfig{{Level: "loud", Format: "text"}, {Level: "info", Format: "xml"}} {
		if _, err := bad.logger(io.Discard); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

var updateReadme = flag.Bool("update-readme", false, "rewrite README.md's flag table from the flags")

const tableBegin, tableEnd = "<!-- flags:begin (generated: go test ./cmd/skein -run TestReadmeFlagTable -update-readme) -->\n", "<!-- flags:end -->"

// flagTable is the Markdown table of the flags of fs: flag, variable, default, meaning.
func flagTable(fs *flag.FlagSet) string {
	var b strings.Builder
	b.WriteString("| flag | variable | default | meaning |\n|---|---|---|---|\n")
	fs.VisitAll(func(f *flag.Flag) {
		def := ""
		if f.DefValue != "" {
			def = "`" + f.DefValue + "`"
		}
		fmt.Fprintf(&b, "| `--%s` | `%s` | %s | %s |\n", f.Name, envName(f.Name), def, strings.ReplaceAll(f.Usage, "|", "\\|"))
	})
	return b.String()
}

// The README's table of the flags of skein serve is the one the flags make: every flag, with its
// variable and default.
func TestReadmeFlagTable(t *testing.T) {
	const path = "../../README.md"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i, j := strings.Index(readme, tableBegin), strings.Index(readme, tableEnd)
	if i < 0 || j < i {
		t.Fatalf("README.md has no flag table between %q and %q", tableBegin, tableEnd)
	}
	fs, _ := serveFlags()
	want := flagTable(fs)
	if got := readme[i+len(tableBegin) : j]; got != want {
		if *updateReadme {
			if err := os.WriteFile(path, []byte(readme[:i+len(tableBegin)]+want+readme[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Fatalf("README.md's flag table is stale: run go test ./cmd/skein -run TestReadmeFlagTable -update-readme\nwant:\n%s", want)
	}
}

// On a signal, shutdown lets the request in flight finish, logs each stage and closes the
// gateway; a request that outlives the bound is cut.
func TestShutdownDrainsThenCloses(t *testing.T) {
	for _, stuck := range []bool{false, true} {
		inFlight, release := make(chan struct{}), make(chan struct{})
		hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(inFlight)
			if stuck {
				<-r.Context().Done()
				return
			}
			<-release
			_, _ = io.WriteString(w, "done")
		})}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = hs.Serve(ln) }()
		answer := make(chan string, 1)
		go func() {
			resp, err := http.Get("http://" + ln.Addr().String())
			if err != nil {
				answer <- err.Error()
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answer <- string(body)
		}()
		<-inFlight
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(errors.New("terminated signal received"))
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		closed := false
		bound := time.Hour
		if stuck {
			bound = time.Millisecond
		}
		done := make(chan error, 1)
		go func() { done <- shutdownOnSignal(ctx, hs, log, bound, func() { closed = true }) }()
		if !stuck {
			close(release)
		}
		err = <-done
		got := <-answer
		if !closed || !strings.Contains(logs.String(), "shutting down") || !strings.Contains(logs.String(), "terminated signal received") {
			t.Fatalf("stuck=%v: closed %v, logs:\n%s", stuck, closed, logs.String())
		}
		if stuck {
			if !strings.Contains(logs.String(), "drain timed out") || got == "done" {
				t.Fatalf("a stuck request: answer %q, logs:\n%s", got, logs.String())
			}
			continue
		}
		if err != nil || got != "done" || !strings.Contains(logs.String(), "msg=closed") {
			t.Fatalf("drain: %v, answer %q, logs:\n%s", err, got, logs.String())
		}
	}
}

// A gateway with PostgreSQL and a bucket needs no data directory: given none, it works in a
// private scratch directory, removed when it stops. A --data given (flag or variable), skein
// serve, or a gateway whose state is in its data directory keep theirs.
func TestAGatewayOnPostgresAndS3NeedsNoDataDirectory(t *testing.T) {
	shared := []string{"--state", "postgres://db/skein", "--storage", "s3://bucket/prefix"}
	c, err := parseServeConfig(shared)
	if err != nil {
		t.Fatal(err)
	}
	cleanup, err := scratchData(c, true)
	if err != nil {
		t.Fatal(err)
	}
	if c.Data == "./skein-data" || !strings.Contains(c.Data, "skein-gateway-") {
		t.Fatalf("data directory %q, want a private scratch one", c.Data)
	}
	if fi, err := os.Stat(c.Data); err != nil || !fi.IsDir() {
		t.Fatalf("scratch directory %q: %v", c.Data, err)
	}
	cleanup()
	if _, err := os.Stat(c.Data); !os.IsNotExist(err) {
		t.Fatalf("scratch directory %q left behind: %v", c.Data, err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		env     string
		gateway bool
	}{
		{"--data given", append([]string{"--data", "/srv/skein"}, shared...), "", true},
		{"SKEIN_DATA given", shared, "/srv/skein", true},
		{"skein serve", shared, "", false},
		{"state in the data directory", []string{"--storage", "s3://bucket/prefix"}, "", true},
		{"files in the data directory", []string{"--state", "postgres://db/skein"}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SKEIN_DATA", tc.env)
			c, err := parseServeConfig(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			want := c.Data
			cleanup, err := scratchData(c, tc.gateway)
			if err != nil {
				t.Fatal(err)
			}
			defer cleanup()
			if c.Data != want || strings.Contains(c.Data, "skein-gateway-") {
				t.Fatalf("data directory %q, want %q kept", c.Data, want)
			}
		})
	}
}

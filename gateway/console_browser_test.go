package gateway_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/skein-ai/skein/api"
)

// chromium finds a Chromium to drive: $SKEIN_CHROMIUM, else Debian's chromium on the PATH.
func chromium() string {
	if p := os.Getenv("SKEIN_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// browser starts a headless Chromium with a fresh profile for the test.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := chromium()
	if path == "" {
		t.Skip("no chromium on this machine (CI installs Debian's chromium; or set SKEIN_CHROMIUM)")
	}
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath(path), chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true), chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true), chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.WindowSize(1280, 1000)}
	// A bound on a hung browser, not a timing assertion.
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	t.Cleanup(cancel)
	ctx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancelBrowser := chromedp.NewContext(ctx)
	t.Cleanup(cancelBrowser)
	if err := chromedp.Do(ctx); err != nil {
		t.Skipf("chromium %s does not start: %v", path, err)
	}
	return ctx
}

// enterKey opens the console and enters a key, which reloads the page under it.
func enterKey(ctx context.Context, url, key string) error {
	steps := []struct {
		what string
		do   chromedp.Action[chromedp.Void]
	}{
		{"open the console", chromedp.Navigate(url)},
		{"find the key field", chromedp.WaitVisible(chromedp.ID("key-input"))},
		{"type the key", chromedp.SendKeys(chromedp.ID("key-input"), key)},
		{"submit the key", chromedp.Click(chromedp.CSS("#key-form button"))},
		{"see the console", chromedp.WaitVisible(chromedp.ID("main"))},
		// Loaded: no status line, and the runs table holds rows or says it has none.
		{"wait for the runs", chromedp.Poll[chromedp.Void](`document.querySelector("#status").textContent === "" && document.querySelector("#runs tbody").children.length > 0`,
			chromedp.WithPollingInterval(50*time.Millisecond))},
	}
	for _, st := range steps {
		if err := chromedp.Do(ctx, st.do); err != nil {
			state, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + " | " + document.querySelector("#status").textContent`))
			return fmt.Errorf("%s: %w (page: %s)", st.what, err, state)
		}
	}
	return nil
}

// In a real browser: a tenant who trained a run sees it listed with one loss point per step;
// another tenant's key sees nothing of it. The screenshot goes to $SKEIN_CONSOLE_SCREENSHOT
// (else the test's temp dir).
func TestConsoleInBrowser(t *testing.T) {
	ctx := browser(t)
	ts, st := newKeysServer(t) // in open mode every key is an admin and sees the fleet
	alice, _ := issue(t, st, "alice", false)
	mallory, _ := issue(t, st, "mallory", false)
	admin, _ := issue(t, st, "ops", true)
	const steps = 5
	_, tc := newRun(t, ts.URL, alice, 4)
	data := []api.Datum{datum(ts.eng.Tokenizer.Encode("The console draws one point per step."), true)}
	for range steps {
		stepMetricsOf(t, tc, data, false)
		f, err := tc.OptimStep(context.Background(), 1e-2)
		await(t, f, err, &map[string]any{})
	}
	f, err := tc.SaveWeightsForSampler(context.Background(), "final")
	await(t, f, err, &map[string]any{})

	if err := enterKey(ctx, ts.URL+"/", alice); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.ID("chart-loss"))); err != nil {
		t.Fatal(err)
	}
	listed, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#runs tbody")))
	if err != nil {
		t.Fatal(err)
	}
	points, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#chart-loss circle").length`))
	if err != nil {
		t.Fatal(err)
	}
	stored, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`sessionStorage.getItem("skein.apiKey") === %q && !location.href.includes(%q)`, alice, alice)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(listed, tc.ModelID) {
		t.Fatalf("run %s not listed: %q", tc.ModelID, listed)
	}
	if points != steps {
		t.Fatalf("loss chart has %d points, want %d (one per step)", points, steps)
	}
	stepCell, err := chromedp.Run(ctx, chromedp.Poll[string](`document.querySelector("#runs tr.run").children[3].textContent`,
		chromedp.WithPollingInterval(50*time.Millisecond)))
	if err != nil || stepCell != strconv.Itoa(steps) {
		t.Fatalf("the run's step cell says %q, want %d (%v)", stepCell, steps, err)
	}
	hidden, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector("#admin").hidden`))
	if err != nil || !hidden {
		t.Fatalf("a tenant's key sees the fleet panel (%v)", err)
	}
	if !stored {
		t.Fatal("the key is not (only) in sessionStorage")
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	shot := os.Getenv("SKEIN_CONSOLE_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "console.png")
	}
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))

	// The checkpoint's Publish button works through the same API (and the owned listing of
	// another tenant still leaves the run out below).
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#checkpoints tbody button"))); err != nil {
		t.Fatal(err)
	}
	public, err := chromedp.Run(ctx, chromedp.Poll[string](`(c => c && c.textContent === "yes" && c.textContent)(document.querySelector("#checkpoints tbody td:nth-child(5)"))`,
		chromedp.WithPollingInterval(50*time.Millisecond)))
	if err != nil || public != "yes" {
		t.Fatalf("publishing from the console: %q %v", public, err)
	}
	if err := enterKey(ctx, ts.URL+"/", mallory); err != nil {
		t.Fatal(err)
	}
	page, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
	if err != nil {
		t.Fatal(err)
	}
	charts, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#charts svg").length`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(page, tc.ModelID) || charts != 0 {
		t.Fatalf("another tenant's console shows the run (%d charts): %q", charts, page)
	}
	if !strings.Contains(page, "No training runs yet.") {
		t.Fatalf("another tenant's console: %q", page)
	}
	if err := enterKey(ctx, ts.URL+"/", admin); err != nil {
		t.Fatal(err)
	}
	fleet, err := chromedp.Run(ctx, chromedp.Poll[string](`!document.querySelector("#admin").hidden && document.querySelector("#admin").textContent`,
		chromedp.WithPollingInterval(50*time.Millisecond)))
	if err != nil || !strings.Contains(fleet, "r0") || !strings.Contains(fleet, "queue_depth") {
		t.Fatalf("the admin key's fleet panel: %q %v", fleet, err)
	}
}

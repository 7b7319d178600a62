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

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
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
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
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
	if err != nil || !strings.Contains(fleet, "r0") || !strings.Contains(fleet, "queue depth") {
		t.Fatalf("the admin key's fleet panel: %q %v", fleet, err)
	}
}

// poll waits for a JS expression to be truthy and returns its value.
func poll[T any](ctx context.Context, t *testing.T, what, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Poll[T](expr, chromedp.WithPollingInterval(50*time.Millisecond)))
	if err != nil {
		page, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#status").textContent`))
		t.Fatalf("%s: %v (status: %q)", what, err, page)
	}
	return v
}

func eval[T any](ctx context.Context, t *testing.T, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// shoot saves a screenshot at width×900 to $SKEIN_CONSOLE_SHOTS (else a temp dir) and checks
// that the page fits that width: no horizontal scrolling.
func shoot(ctx context.Context, t *testing.T, name string, width int64) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(width, 900)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // a relayout, not a result being waited for
	if w := eval[int](ctx, t, `document.documentElement.scrollWidth`); w > int(width) {
		t.Errorf("%s: the page is %d px wide in a %d px window", name, w, width)
	}
	// Each table fits its box too (its wrapper would otherwise scroll it sideways).
	if wide := eval[string](ctx, t, `[...document.querySelectorAll(".scroll")].filter(d => d.offsetParent && d.scrollWidth > d.clientWidth).map(d => d.firstElementChild.id || d.firstElementChild.className).join(",")`); wide != "" {
		t.Errorf("%s: tables wider than the %d px window: %s", name, width, wide)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("SKEIN_CONSOLE_SHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%d.png", name, width))
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// The live console (issue 22): steps trained while the page is open show up without a click;
// Download starts the signed archive download; the TTL prompt takes "2h" and refuses typos;
// the playground lists every sampler checkpoint and the base model and words errors as the
// server does; the fleet panel shows only to a key the server says may read it; the page fits
// 1280 and 800 px.
func TestConsoleLiveInBrowser(t *testing.T) {
	ctx := browser(t)
	ts, st := newKeysServer(t)
	alice, _ := issue(t, st, "alice", false)
	bob, _ := issue(t, st, "bob", false)
	admin, _ := issue(t, st, "ops", true)
	_, tc := newRun(t, ts.URL, alice, 4)
	data := []api.Datum{datum(ts.eng.Tokenizer.Encode("A live console keeps up with training."), true)}
	train := func(n int) {
		for range n {
			stepMetricsOf(t, tc, data, false)
			f, err := tc.OptimStep(context.Background(), 1e-2)
			await(t, f, err, &map[string]any{})
		}
	}
	train(3)
	for _, name := range []string{"first", "second"} {
		f, err := tc.SaveWeightsForSampler(context.Background(), name)
		await(t, f, err, &map[string]any{})
	}

	if err := enterKey(ctx, ts.URL+"/", alice); err != nil {
		t.Fatal(err)
	}
	poll[bool](ctx, t, "three loss points", `document.querySelectorAll("#chart-loss circle").length === 3`)
	// Training goes on while the page stays open: the chart and the runs table follow, no click.
	train(2)
	poll[bool](ctx, t, "the chart grows to five points by itself", `document.querySelectorAll("#chart-loss circle").length === 5`)
	poll[bool](ctx, t, "the step cell follows", `document.querySelector("#runs tr.run td.step").textContent === "5"`)
	if state := poll[string](ctx, t, "the run's state", `document.querySelector("#runs tr.run td.state").textContent`); !strings.Contains(state, "idle") {
		t.Fatalf("run state %q", state)
	}
	// A hidden tab stops polling; showing it again catches up at once.
	polls := `performance.getEntriesByType("resource").filter(e => e.name.includes("/api/v1/training_runs?")).length`
	eval[bool](ctx, t, `Object.defineProperty(document, "hidden", { value: true, configurable: true }); true`)
	time.Sleep(500 * time.Millisecond) // a poll already under way ends
	hiddenFrom := eval[int](ctx, t, polls)
	train(1)
	time.Sleep(4 * time.Second) // more than a polling interval
	if n := eval[int](ctx, t, polls); n != hiddenFrom {
		t.Fatalf("a hidden tab polled %d times", n-hiddenFrom)
	}
	eval[bool](ctx, t, `delete document.hidden; document.dispatchEvent(new Event("visibilitychange")); true`)
	poll[bool](ctx, t, "shown again, the chart catches up", `document.querySelectorAll("#chart-loss circle").length === 6`)
	// Labelled axes, and a log scale for the loss.
	if labels := eval[string](ctx, t, `[...document.querySelectorAll("#chart-loss text.axis-label")].map(e => e.textContent).join("|")`); !strings.Contains(labels, "step") || !strings.Contains(labels, "loss") {
		t.Fatalf("axis labels %q", labels)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("loss-log"))); err != nil {
		t.Fatal(err)
	}
	poll[bool](ctx, t, "log scale", `document.querySelector("#chart-loss").dataset.scale === "log" && document.querySelectorAll("#chart-loss circle").length === 6`)

	// Playground: both sampler checkpoints and the base model; an unknown model's error as the server words it.
	models := poll[string](ctx, t, "playground models", `(t => t.includes("second") && t)([...document.querySelectorAll("#pg-model option")].map(o => o.value).join("|"))`)
	if !strings.Contains(models, "/first") || !strings.Contains(models, "/second") || !strings.Contains(models, base) {
		t.Fatalf("playground lists %q", models)
	}
	eval[bool](ctx, t, `(s => { s.appendChild(new Option("nope", "no-such-model")); s.value = "no-such-model"; return true; })(document.querySelector("#pg-model"))`)
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#playground button"))); err != nil {
		t.Fatal(err)
	}
	out := poll[string](ctx, t, "playground error", `(t => t !== "…" && t !== "" && t)(document.querySelector("#pg-out").textContent)`)
	if !strings.Contains(out, "does not exist") || strings.Contains(out, "no /v1/completions endpoint") {
		t.Fatalf("playground error %q", out)
	}

	// Download: the page asks for the signed URL and the browser downloads the archive from it.
	dir := t.TempDir()
	begun := make(chan string, 4)
	done := make(chan string, 4)
	go func() {
		for ev, err := range chromedp.Events(ctx, cdpbrowser.DownloadWillBegin) {
			if err != nil {
				return
			}
			begun <- ev.URL
		}
	}()
	go func() {
		for ev, err := range chromedp.Events(ctx, cdpbrowser.DownloadProgress) {
			if err != nil {
				return
			}
			if ev.State == cdpbrowser.DownloadProgressStateCompleted {
				done <- ev.GUID
			}
		}
	}()
	if err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Call(ctx, cdpbrowser.SetDownloadBehavior, cdpbrowser.SetDownloadBehaviorParams{
			Behavior: cdpbrowser.SetDownloadBehaviorBehaviorAllowAndName, DownloadPath: dir, EventsEnabled: ptrTo(true)})
		return err
	})); err != nil {
		t.Fatal(err)
	}
	clickInPage(ctx, t, `#checkpoints tbody button[data-action="download"]`)
	select {
	case url := <-begun:
		if !strings.HasPrefix(url, ts.URL+"/api/v1/archives/") {
			t.Fatalf("the download is of %q, not a signed archive URL", url)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("Download started no download (status %q)", eval[string](ctx, t, `document.querySelector("#status").textContent`))
	}
	select {
	case guid := <-done:
		b, err := os.ReadFile(filepath.Join(dir, guid))
		if err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Fatalf("downloaded %d bytes, not a gzip archive (%v)", len(b), err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the download did not complete")
	}

	// TTL: "2h" sets two hours; a typo is refused with a message and changes nothing.
	eval[bool](ctx, t, `window.prompt = () => "2h"; true`)
	clickInPage(ctx, t, `#checkpoints tbody button[data-action="ttl"]`)
	poll[bool](ctx, t, "an expiry is shown", `document.querySelector("#checkpoints tbody td:nth-child(6)").textContent !== "never"`)
	expiry := func() time.Time {
		var got api.CheckpointsResponse
		if err := client.New(ts.URL, alice).Do(context.Background(), "GET", "training_runs/"+tc.ModelID+"/checkpoints", nil, &got); err != nil {
			t.Fatal(err)
		}
		for _, c := range got.Checkpoints {
			if c.ExpiresAt != nil {
				e, _ := time.Parse(time.RFC3339Nano, *c.ExpiresAt)
				return e
			}
		}
		return time.Time{}
	}
	if left := time.Until(expiry()); left < 119*time.Minute || left > 121*time.Minute {
		t.Fatalf("TTL 2h set an expiry %v away", left)
	}
	eval[bool](ctx, t, `window.prompt = () => " 30m "; true`)
	clickInPage(ctx, t, `#checkpoints tbody button[data-action="ttl"]`)
	deadline := time.Now().Add(10 * time.Second)
	for left := time.Until(expiry()); left < 29*time.Minute || left > 31*time.Minute; left = time.Until(expiry()) {
		if time.Now().After(deadline) {
			t.Fatalf("TTL 30m set an expiry %v away", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
	before := expiry()
	// The page's refresh after the last TTL ends by clearing the status line: let it end first.
	// (An empty status line does not say so: the refresh may not have begun when the API already
	// shows the new expiry, and would then overwrite the typo's message with "Loading…".)
	poll[bool](ctx, t, "the refresh after the TTL", `document.body.dataset.pending === "0" && document.querySelector("#status").textContent === ""`)
	eval[bool](ctx, t, `window.prompt = () => "2 hours"; true`)
	clickInPage(ctx, t, `#checkpoints tbody button[data-action="ttl"]`)
	if msg := poll[string](ctx, t, "the typo's message", `(s => s.className === "error" && s.textContent)(document.querySelector("#status"))`); !strings.Contains(msg, "2 hours") {
		t.Fatalf("TTL typo message %q", msg)
	}
	if after := expiry(); !after.Equal(before) {
		t.Fatalf("a refused TTL changed the expiry: %v then %v", before, after)
	}

	// The fleet panel: a tenant's key never sees it nor probes for it; the page fits.
	if !eval[bool](ctx, t, `document.querySelector("#admin").hidden && !performance.getEntriesByType("resource").some(e => e.name.includes("skein/replicas"))`) {
		t.Fatal("a tenant's console shows or probes the fleet panel")
	}
	shoot(ctx, t, "tenant", 1280)
	shoot(ctx, t, "tenant", 800)

	// A new key sees the base model in the playground.
	if err := enterKey(ctx, ts.URL+"/", bob); err != nil {
		t.Fatal(err)
	}
	if models := poll[string](ctx, t, "a new key's models", `[...document.querySelectorAll("#pg-model option")].map(o => o.value).join("|")`); !strings.Contains(models, base) {
		t.Fatalf("a new key's playground lists %q", models)
	}

	// The admin key's fleet tables: no raw JSON, and they fit at 1280 and 800 px.
	if err := enterKey(ctx, ts.URL+"/", admin); err != nil {
		t.Fatal(err)
	}
	fleet := poll[string](ctx, t, "the fleet panel", `!document.querySelector("#admin").hidden && document.querySelector("#admin").textContent`)
	if strings.Contains(fleet, "{\"") || strings.Contains(fleet, "[{") || strings.Contains(fleet, "[object") {
		t.Fatalf("raw JSON in the fleet panel: %q", fleet)
	}
	shoot(ctx, t, "admin", 1280)
	shoot(ctx, t, "admin", 800)
}

func ptrTo[T any](v T) *T { return &v }

// clickInPage clicks the element selector names from inside the page, in one step, once it
// exists: the live console redraws its tables every few seconds, so a node found by one
// protocol call may be gone by the next (chromedp.Click's find-then-click).
func clickInPage(ctx context.Context, t *testing.T, selector string) {
	t.Helper()
	poll[bool](ctx, t, "clicking "+selector, fmt.Sprintf(`(b => !!b && (b.click(), true))(document.querySelector(%q))`, selector))
}

// Package lab is the network-namespace lab: a gateway, two workers and an S3 server as separate
// hosts (Linux network namespaces on one bridge, each with its own data directory), started from
// the real skein binary, to test what only a network can break. It runs when SKEIN_LAB=1 (root,
// iproute2; .ci/run sets it when it can create a namespace) and SKEIN_LAB_VERSITYGW names the S3
// server's binary; otherwise it skips, saying so. Traffic stays inside the namespaces it makes:
// the test's own client dials from one of them too.
package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
)

const (
	token     = "lab-cluster-token"
	accessKey = "lab-access"
	secretKey = "lab-secret-key-0123"
	modelName = "tiny-qwen3"
)

// net is one lab: a switch namespace with a bridge, and hosts on 10.200.N.0/24.
type lab struct {
	t      *testing.T
	id     string // short random tag of this lab's namespaces
	subnet string // "10.200.N."
	hosts  map[string]string
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (l *lab) ns(host string) string { return "sk" + l.id + host }

// newLab makes the switch and one namespace per host, each on the bridge with its address.
func newLab(t *testing.T, hosts map[string]int) *lab {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	l := &lab{t: t, id: hex.EncodeToString(b[:2]), subnet: fmt.Sprintf("10.200.%d.", b[2]), hosts: map[string]string{}}
	sw := l.ns("sw")
	run(t, "ip", "netns", "add", sw)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", sw).Run() })
	run(t, "ip", "-n", sw, "link", "add", "br0", "type", "bridge")
	run(t, "ip", "-n", sw, "link", "set", "br0", "up")
	for h, last := range hosts {
		ns := l.ns(h)
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		run(t, "ip", "-n", sw, "link", "add", "s-"+h, "type", "veth", "peer", "name", "eth0", "netns", ns)
		run(t, "ip", "-n", sw, "link", "set", "s-"+h, "master", "br0", "up")
		ip := fmt.Sprintf("%s%d", l.subnet, last)
		run(t, "ip", "-n", ns, "addr", "add", ip+"/24", "dev", "eth0")
		run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
		l.hosts[h] = ip
	}
	return l
}

// cut takes a host off the switch (both directions); heal puts it back.
func (l *lab) cut(host string)  { run(l.t, "ip", "-n", l.ns("sw"), "link", "set", "s-"+host, "down") }
func (l *lab) heal(host string) { run(l.t, "ip", "-n", l.ns("sw"), "link", "set", "s-"+host, "up") }

// start runs a program in a host's namespace; it is killed when the test ends (or before, by
// the caller, through the command it returns: `ip netns exec` execs the program itself).
func (l *lab) start(host, logName string, env []string, name string, args ...string) *exec.Cmd {
	t := l.t
	logf, err := os.Create(filepath.Join(t.TempDir(), logName+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", l.ns(host), name}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("--- %s log:\n%s", logName, tail(string(b), 4000))
		}
	})
	return cmd
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// dialer dials from inside a host's namespace: a goroutine locks its thread, enters the
// namespace, dials and ends still locked, so its thread is discarded and no other goroutine
// ever runs in the namespace. The connection stays in the namespace it was made in.
func (l *lab) dialer(host string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	path := "/var/run/netns/" + l.ns(host)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
			f, err := os.Open(path)
			if err != nil {
				ch <- result{nil, err}
				return
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				ch <- result{nil, fmt.Errorf("setns %s: %w", path, err)}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

// waitListening waits until addr accepts connections from host.
func (l *lab) waitListening(host, addr string) {
	dial := l.dialer(host)
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := dial(context.Background(), "tcp", addr)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("%s does not listen: %v", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestLabCutWorkerTrainingGoesOn(t *testing.T) {
	if os.Getenv("SKEIN_LAB") != "1" {
		t.Skip("SKEIN_LAB=1 is not set (the network-namespace lab needs root and iproute2; .ci/run sets it when it can create a namespace)")
	}
	vgw := os.Getenv("SKEIN_LAB_VERSITYGW")
	if vgw == "" {
		t.Skip("SKEIN_LAB_VERSITYGW (the versitygw binary .ci/s3.sh builds) is not set")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "skein")
	build := exec.Command("go", "build", "-o", bin, "github.com/skein-ai/skein/cmd/skein")
	build.Env = append(os.Environ(), "GOEXPERIMENT=simd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building skein: %v\n%s", err, out)
	}
	model := filepath.Join(dir, modelName)
	run(t, bin, "model", "init-tiny", model)

	l := newLab(t, map[string]int{"gw": 2, "w1": 3, "w2": 4, "s3": 5, "cl": 9})
	// The S3 host: a bucket is a directory of versitygw's posix backend.
	s3Data := filepath.Join(dir, "s3")
	if err := os.MkdirAll(filepath.Join(s3Data, "lab"), 0o755); err != nil {
		t.Fatal(err)
	}
	l.start("s3", "versitygw", []string{"ROOT_ACCESS_KEY=" + accessKey, "ROOT_SECRET_KEY=" + secretKey}, vgw,
		"--port", l.hosts["s3"]+":7070", "--quiet", "posix", s3Data)
	l.waitListening("cl", l.hosts["s3"]+":7070")
	awsEnv := []string{"AWS_ACCESS_KEY_ID=" + accessKey, "AWS_SECRET_ACCESS_KEY=" + secretKey, "AWS_REGION=us-east-1"}
	storageFlags := []string{"--storage", "s3://lab/cluster", "--s3-endpoint", "http://" + l.hosts["s3"] + ":7070"}

	// The gateway host, keys mode (it listens off loopback), with its own data directory.
	gwData := filepath.Join(dir, "gw")
	key := strings.TrimSpace(strings.SplitN(run(t, bin, "keys", "create", "--name", "lab", "--admin", "--data", gwData), "\n", 2)[0])
	if !strings.HasPrefix(key, "tml-") {
		t.Fatalf("keys create printed %q", key)
	}
	gwURL := "http://" + l.hosts["gw"] + ":8000"
	l.start("gw", "gateway", awsEnv, bin, append([]string{"gateway", "--addr", l.hosts["gw"] + ":8000", "--data", gwData,
		"--auth", "keys", "--worker-token", token, "--public-url", gwURL}, storageFlags...)...)
	for _, w := range []string{"w1", "w2"} {
		l.start(w, w, awsEnv, bin, append([]string{"worker", "--gateway", gwURL, "--model", model, "--worker-token", token,
			"--data", filepath.Join(dir, w), "--addr", l.hosts[w] + ":9000", "--step-memory-mb", "256"}, storageFlags...)...)
	}

	c := client.New(gwURL, key)
	c.HTTP = &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DialContext: l.dialer("cl")}}
	ctx := context.Background()
	replicas := func() map[string][]string {
		var out api.ReplicasResponse
		if err := c.Do(ctx, "GET", "skein/replicas", nil, &out); err != nil {
			return nil
		}
		m := map[string][]string{}
		for _, r := range out.Replicas {
			m[r.ID] = r.Adapters
		}
		return m
	}
	waitFor := func(what string, limit time.Duration, ok func(map[string][]string) bool) map[string][]string {
		t.Helper()
		deadline := time.Now().Add(limit)
		for {
			m := replicas()
			if m != nil && ok(m) {
				return m
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v (replicas %v)", what, limit, m)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	idOf := func(host string) string { return modelName + "@" + l.hosts[host] + ":9000" }
	waitFor("both workers registered", 2*time.Minute, func(m map[string][]string) bool {
		_, a := m[idOf("w1")]
		_, b := m[idOf("w2")]
		return a && b
	})

	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, modelName, 4)
	if err != nil {
		t.Fatal(err)
	}
	var losses []float64
	for range 3 {
		losses = append(losses, step(t, tc, len(losses)+1))
	}
	m := replicas()
	holder := ""
	for _, h := range []string{"w1", "w2"} {
		for _, a := range m[idOf(h)] {
			if a == tc.ModelID {
				holder = h
			}
		}
	}
	if holder == "" {
		t.Fatalf("no worker holds %s: %v", tc.ModelID, m)
	}
	l.cut(holder)
	cutAt := time.Now()
	waitFor("the cut worker dropped", time.Minute, func(m map[string][]string) bool { _, ok := m[idOf(holder)]; return !ok })
	t.Logf("the gateway dropped %s %.1f s after the cut", holder, time.Since(cutAt).Seconds())
	for range 3 {
		losses = append(losses, step(t, tc, len(losses)+1))
	}
	l.heal(holder)
	healAt := time.Now()
	waitFor("the healed worker back", time.Minute, func(m map[string][]string) bool { _, ok := m[idOf(holder)]; return ok })
	t.Logf("%s re-registered %.1f s after the heal", holder, time.Since(healAt).Seconds())
	losses = append(losses, step(t, tc, len(losses)+1))

	// The same seven steps without a network, in process: the same losses, bit for bit.
	want := reference(t, model, len(losses))
	for i := range want {
		if losses[i] != want[i] {
			t.Fatalf("step %d: loss %v in the lab, %v uninterrupted (lab %v, reference %v)", i+1, losses[i], want[i], losses, want)
		}
	}
	// Nothing of the adapter is on any host's disk: it is all in the bucket.
	for _, h := range []string{"gw", "w1", "w2"} {
		for _, sub := range []string{"state", "checkpoints"} {
			if entries, err := os.ReadDir(filepath.Join(dir, h, sub)); err == nil && len(entries) > 0 {
				t.Fatalf("%s's data directory holds %s/ (%d entries)", h, sub, len(entries))
			}
		}
	}
	if !hasObjects(filepath.Join(s3Data, "lab", "cluster", "state")) {
		t.Fatal("the bucket holds no adapter state")
	}
	// The gateway host has no model directory: the tokenizer it serves is the one the workers
	// published in the bucket (asynchronously: wait for it).
	var tok struct {
		ModelName string `json:"model_name"`
	}
	deadline := time.Now().Add(30 * time.Second)
	for c.Do(ctx, "GET", "models/"+modelName+"/tokenizer", nil, &tok) != nil || tok.ModelName != modelName {
		if time.Now().After(deadline) {
			t.Fatal("the gateway serves no tokenizer for the workers' model")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

var batch = []api.Datum{{
	ModelInput: api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: []int{10, 20, 30, 40, 50, 60}}}},
	LossFnInputs: map[string]api.TensorData{
		"target_tokens": {Data: []float64{20, 30, 40, 50, 60, 70}, DType: "int64", Shape: []int{6}},
		"weights":       {Data: []float64{1, 1, 1, 1, 1, 1}, DType: "float32", Shape: []int{6}},
	},
}}

// step trains one step and returns its forward_backward loss; the step must be acknowledged
// with the expected step count (none lost, none run twice).
func step(t *testing.T, tc *client.TrainingClient, n int) float64 {
	t.Helper()
	return stepWith(t, tc, n, batch)
}

// stepWith is step over another batch.
func stepWith(t *testing.T, tc *client.TrainingClient, n int, batch []api.Datum) float64 {
	t.Helper()
	ctx := context.Background()
	fb, err := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	op, err := tc.OptimStep(ctx, 1e-2)
	if err != nil {
		t.Fatal(err)
	}
	var out api.ForwardBackwardOutput
	if err := fb.Result(ctx, &out); err != nil {
		t.Fatalf("step %d forward_backward: %v", n, err)
	}
	var res struct {
		Metrics map[string]float64 `json:"metrics"`
	}
	if err := op.Result(ctx, &res); err != nil {
		t.Fatalf("step %d optim_step: %v", n, err)
	}
	if res.Metrics["step:max"] != float64(n) {
		t.Fatalf("step %d: the adapter's step count is %v", n, res.Metrics["step:max"])
	}
	return out.Metrics["loss:sum"]
}

// reference is the losses of n steps on one in-process replica of the same model.
func reference(t *testing.T, model string, n int) []float64 {
	return referenceWith(t, model, n, batch)
}

// referenceWith is reference over another batch.
func referenceWith(t *testing.T, model string, n int, batch []api.Datum) []float64 {
	e, err := engine.Load(model, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := replica.New("ref", modelName, e, 4)
	defer rep.Close()
	gw, err := gateway.New(gateway.Options{DataDir: t.TempDir()}, rep)
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gw}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	c := client.New("http://"+ln.Addr().String(), "tml-reference")
	ctx := context.Background()
	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, modelName, 4)
	if err != nil {
		t.Fatal(err)
	}
	var out []float64
	for i := range n {
		out = append(out, stepWith(t, tc, i+1, batch))
	}
	return out
}

func hasObjects(dir string) bool {
	found := false
	_ = filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			found = true
		}
		return nil
	})
	return found
}

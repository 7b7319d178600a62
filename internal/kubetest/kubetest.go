// Package kubetest starts a real Kubernetes control plane on loopback for tests: etcd,
// kube-apiserver (token authentication, RBAC, service-account tokens) and, when asked,
// kube-controller-manager with the controllers a test names. There is no kubelet and no
// scheduler: a test that needs running pods binds them to a Node object and writes their status
// itself.
//
// The binaries are built by scripts/kube-control-plane.sh; tests find them through
// SKEIN_TEST_KUBE_APISERVER (the directory holding etcd, kube-apiserver and
// kube-controller-manager) and skip when it is unset.
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// EnvVar names the directory with the control plane's binaries.
const EnvVar = "SKEIN_TEST_KUBE_APISERVER"

// Options says what to start besides etcd and kube-apiserver.
type Options struct {
	// Controllers for kube-controller-manager's --controllers (e.g. "endpointslice-controller");
	// none: the controller manager is not started.
	Controllers []string
}

// ControlPlane is a running etcd + kube-apiserver (+ controller manager).
type ControlPlane struct {
	// Admin is a client configuration with the system:masters token.
	Admin *rest.Config
	// URL is the API server's https address on loopback.
	URL string

	dir   string
	token string // the admin's
	caPEM []byte
	procs []*process
}

type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// Start starts a control plane for t and stops it when t ends; t is skipped when EnvVar is unset.
func Start(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	bin := os.Getenv(EnvVar)
	if bin == "" {
		t.Skipf("%s unset: set it to the directory scripts/kube-control-plane.sh prints (etcd, kube-apiserver, kube-controller-manager) to run this test against a real control plane", EnvVar)
	}
	cp := &ControlPlane{dir: t.TempDir()}
	t.Cleanup(func() { cp.stop(t) })
	if err := cp.start(bin, opts); err != nil {
		t.Fatalf("kubetest: %v", err) // the cleanup prints the processes' logs
	}
	return cp
}

func (cp *ControlPlane) start(bin string, opts Options) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	if err := cp.run(filepath.Join(bin, "etcd"), filepath.Join(cp.dir, "etcd"), strconv.Itoa(ports[0]), strconv.Itoa(ports[1])); err != nil {
		return err
	}
	if cp.token, err = cp.writeCredentials(); err != nil {
		return err
	}
	cp.URL = "https://127.0.0.1:" + strconv.Itoa(ports[2])
	if err := cp.run(filepath.Join(bin, "kube-apiserver"), cp.apiserverArgs(etcdURL, ports[2])...); err != nil {
		return err
	}
	if err := cp.waitReady(2 * time.Minute); err != nil {
		return err
	}
	cp.Admin = cp.ConfigForToken(cp.token)
	if len(opts.Controllers) == 0 {
		return nil
	}
	kubeconfig, err := cp.writeKubeconfig(cp.token)
	if err != nil {
		return err
	}
	return cp.run(filepath.Join(bin, "kube-controller-manager"), "--kubeconfig="+kubeconfig,
		"--controllers="+strings.Join(opts.Controllers, ","), "--leader-elect=false", "--secure-port=0",
		"--use-service-account-credentials=false")
}

func (cp *ControlPlane) apiserverArgs(etcdURL string, port int) []string {
	return []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		// With a loopback advertise address the default reconciler refuses to write the
		// kubernetes Service's endpoints.
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Join(cp.dir, "certs"),
		"--token-auth-file=" + filepath.Join(cp.dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(cp.dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(cp.dir, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
	}
}

// ConfigForToken is a client configuration for the API server with a bearer token (a service
// account's, from the TokenRequest API, to act with exactly its RBAC).
func (cp *ControlPlane) ConfigForToken(token string) *rest.Config {
	return &rest.Config{Host: cp.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM},
		QPS: 100, Burst: 200}
}

// writeCredentials writes the token file (one system:masters token, random) and the service
// account signing key pair, and returns the token.
func (cp *ControlPlane) writeCredentials() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b)
	if err := os.WriteFile(filepath.Join(cp.dir, "tokens.csv"), []byte(token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return "", err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", err
	}
	priv := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(filepath.Join(cp.dir, "sa.key"), priv, 0o600); err != nil {
		return "", err
	}
	return token, os.WriteFile(filepath.Join(cp.dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
}

func (cp *ControlPlane) writeKubeconfig(token string) (string, error) {
	caFile := filepath.Join(cp.dir, "ca.crt")
	if err := os.WriteFile(caFile, cp.caPEM, 0o600); err != nil {
		return "", err
	}
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubetest
  cluster: {server: %q, certificate-authority: %q}
users:
- name: admin
  user: {token: %q}
contexts:
- name: kubetest
  context: {cluster: kubetest, user: admin}
current-context: kubetest
`, cp.URL, caFile, token)
	path := filepath.Join(cp.dir, "kubeconfig")
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}

// waitReady waits for the API server's serving certificate (its own, self-signed, written to
// --cert-dir) and then for /readyz to answer ok, which includes RBAC's bootstrap roles.
func (cp *ControlPlane) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	certFile := filepath.Join(cp.dir, "certs", "apiserver.crt")
	var last error
	for time.Now().Before(deadline) {
		if err := cp.exited(); err != nil {
			return err
		}
		time.Sleep(250 * time.Millisecond)
		pemBytes, err := os.ReadFile(certFile)
		if err != nil {
			last = err
			continue
		}
		cp.caPEM = pemBytes
		if last = cp.readyz(); last == nil {
			return nil
		}
	}
	return fmt.Errorf("kube-apiserver not ready after %v: %v", limit, last)
}

func (cp *ControlPlane) readyz() error {
	rc := cp.ConfigForToken(cp.token)
	tr, err := rest.TransportFor(rc)
	if err != nil {
		return err
	}
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := c.Get(cp.URL + "/readyz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %s: %.200s", resp.Status, body.String())
	}
	return nil
}

// run starts one binary with its output in a log file beside the others.
func (cp *ControlPlane) run(path string, args ...string) error {
	name := filepath.Base(path)
	logPath := filepath.Join(cp.dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	cp.procs = append(cp.procs, p)
	return nil
}

// exited says which process has already ended, if any (a bad flag, a port taken).
func (cp *ControlPlane) exited() error {
	for _, p := range cp.procs {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %v (log %s)", p.name, p.cmd.ProcessState, p.log)
		default:
		}
	}
	return nil
}

// Exited reports a process of the control plane that has stopped (nil while all run): a test
// that times out waiting for a controller can say why.
func (cp *ControlPlane) Exited() error { return cp.exited() }

// stop ends the processes in reverse order (controller manager, API server, etcd): SIGTERM, then
// SIGKILL after ten seconds.
func (cp *ControlPlane) stop(t testing.TB) {
	if t.Failed() {
		cp.dumpLogs(t)
	}
	for i := len(cp.procs) - 1; i >= 0; i-- {
		p := cp.procs[i]
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// dumpLogs logs the last lines of every process's output.
func (cp *ControlPlane) dumpLogs(t testing.TB) {
	for _, p := range cp.procs {
		b, err := os.ReadFile(p.log)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		t.Logf("--- %s (last %d lines)\n%s", p.name, len(lines), strings.Join(lines, "\n"))
	}
}

// freePorts finds n loopback ports nobody listens on now (all held open until all are chosen,
// so they differ).
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// WaitFor polls cond every 100 ms until it is true or limit passes; the last error cond returned
// is in the failure.
func WaitFor(ctx context.Context, limit time.Duration, what string, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last error
	for {
		ok, err := cond(ctx)
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last == nil {
				last = errors.New("condition still false")
			}
			return fmt.Errorf("%s: not within %v: %w", what, limit, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

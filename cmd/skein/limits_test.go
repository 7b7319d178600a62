package main

import (
	"bufio"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// serveWithLimits runs the API's http.Server, built from these flags, on a loopback port.
func serveWithLimits(t *testing.T, args ...string) string {
	t.Helper()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	limits := addLimitFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	hs := limits.httpServer("", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { hs.Close() })
	return ln.Addr().String()
}

// readUntilClosed reads what the server sends until it closes the connection; it fails the
// test if the server keeps the connection open (the guard is far longer than the timeouts).
func readUntilClosed(t *testing.T, c net.Conn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the server kept the connection open (read so far: %q)", b)
	}
	return string(b)
}

// A client that sends its body too slowly, or leaves a keep-alive connection idle, loses the
// connection: it cannot hold one forever.
func TestHTTPServerCutsSlowAndIdleClients(t *testing.T) {
	addr := serveWithLimits(t, "--http-read-timeout", "200ms", "--http-idle-timeout", "200ms")

	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	_, _ = io.WriteString(slow, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
	readUntilClosed(t, slow)

	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	_, _ = io.WriteString(idle, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(idle)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "ok" {
		t.Fatalf("first request: %q", body)
	}
	_ = idle.SetReadDeadline(time.Now().Add(10 * time.Second))
	if rest, err := br.ReadString('\n'); errors.Is(err, os.ErrDeadlineExceeded) || err == nil {
		t.Fatalf("the idle keep-alive connection stayed open (read %q, %v)", rest, err)
	}
}

// Timeouts that would cut the long-poll, and bounds below 1, are refused.
func TestLimitFlagsCheck(t *testing.T) {
	for _, args := range [][]string{{"--http-read-timeout", "10s"}, {"--http-write-timeout", "5s"},
		{"--run-queue-ops", "0"}, {"--max-request-tokens", "-1"}, {"--http-idle-timeout", "0"}, {"--tenant-checkpoint-bytes", "0"}, {"--session-retention", "0s"}} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		limits := addLimitFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := limits.check(); err == nil || !strings.Contains(err.Error(), "--") {
			t.Errorf("%v accepted (%v)", args, err)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	if err := addLimitFlags(fs).check(); err != nil {
		t.Fatalf("the defaults are refused: %v", err)
	}
}

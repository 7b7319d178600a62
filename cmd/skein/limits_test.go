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

	"github.com/skein-ai/skein/gateway"
)

// serveWithLimits runs the API's http.Server, built from these flags, on a loopback port; its
// handler reads the body and answers "ok".
func serveWithLimits(t *testing.T, args ...string) string {
	return serveHandlerWithLimits(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}), args...)
}

// serveHandlerWithLimits runs h behind the API's http.Server and listener, built from these
// flags, on a loopback port.
func serveHandlerWithLimits(t *testing.T, h http.Handler, args ...string) string {
	t.Helper()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	limits := addLimitFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	hs := limits.httpServer("", h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = hs.Serve(limits.listener(ln, hs.Handler)) }()
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

// trickle sends a request whose 100-byte body comes one byte every 20 ms until the server stops
// reading; it returns the connection.
func trickle(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
	go func() {
		for range 100 {
			if _, err := c.Write([]byte{'x'}); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return c
}

// A body that arrives slower than --min-body-rate (after --min-body-rate-grace) loses its
// connection long before --http-read-timeout, with a 400 saying why; a body sent at once and
// an answer that takes longer than the grace (the long-poll) are untouched.
func TestHTTPServerCutsBodiesBelowTheMinimumRate(t *testing.T) {
	slowAnswer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if r.URL.Path == "/poll" { // holds the request, as retrieve_future's long-poll does
			select {
			case <-time.After(1500 * time.Millisecond):
			case <-r.Context().Done():
				http.Error(w, "cancelled", http.StatusInternalServerError)
				return
			}
		}
		_, _ = io.WriteString(w, "ok")
	})
	addr := serveHandlerWithLimits(t, slowAnswer, "--min-body-rate", "1000", "--min-body-rate-grace", "300ms")
	got := readUntilClosed(t, trickle(t, addr))
	if !strings.Contains(got, "400") || !strings.Contains(got, "bytes/s") {
		t.Fatalf("a trickled body: %q; want a 400 naming the rate", got)
	}

	body := strings.Repeat("y", 64<<10)
	resp, err := http.Post("http://"+addr+"/poll", "text/plain", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "ok" {
		t.Fatalf("a long-poll past the grace: %d %q", resp.StatusCode, b)
	}
}

// A connection that never sends a byte is closed after --http-read-header-timeout (Go applies
// the header deadline from the moment it waits for a request).
func TestHTTPServerClosesSilentConnections(t *testing.T) {
	addr := serveWithLimits(t, "--http-read-header-timeout", "200ms")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	readUntilClosed(t, c)
}

// --max-conns-per-ip and --max-conns cap the connections held open; one over the cap is answered
// 503 and closed at once, and a closed connection frees its place.
func TestHTTPServerCapsConnections(t *testing.T) {
	for _, args := range [][]string{{"--max-conns-per-ip", "2"}, {"--max-conns", "2", "--max-conns-per-ip", "0"}} {
		addr := serveWithLimits(t, args...)
		var held []net.Conn
		for range 2 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			held = append(held, c)
		}
		// The held ones are served (a request on each proves the server took them).
		for _, c := range held {
			_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("%v: a connection within the cap: %v %v", args, resp, err)
			}
		}
		over, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := readUntilClosed(t, over); !strings.Contains(got, "503") || !strings.Contains(got, "connections") {
			t.Fatalf("%v: the connection over the cap got %q; want a 503 naming the cap", args, got)
		}
		over.Close()
		held[0].Close()
		deadline := time.Now().Add(10 * time.Second)
		for {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			c.Close()
			if err == nil && resp.StatusCode == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%v: a closed connection never freed its place (%v %v)", args, resp, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// A worker's server cuts trickled call bodies too (it has no read timeout at all: calls compute
// for minutes), and still answers a call that takes longer than the grace.
func TestWorkerServerCutsBodiesBelowTheMinimumRate(t *testing.T) {
	hs := workerHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		select {
		case <-time.After(700 * time.Millisecond): // a call computing past the grace
		case <-r.Context().Done():
			http.Error(w, "cancelled", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}), 1000, 300*time.Millisecond)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { hs.Close() })
	if got := readUntilClosed(t, trickle(t, ln.Addr().String())); !strings.Contains(got, "bytes/s") {
		t.Fatalf("a trickled call: %q", got)
	}
	resp, err := http.Post("http://"+ln.Addr().String()+"/", "text/plain", strings.NewReader("call"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "ok" {
		t.Fatalf("a slow call: %d %q", resp.StatusCode, b)
	}
}

// A body the handler never reads (a refusal: a foreign Host's 421, a 401) is still held to
// --min-body-rate: Go's server discards up to 256 KiB of an unread body after the handler, on
// the connection's read deadline alone, so a trickle under a refused Host kept its connection
// for the whole --http-read-timeout (issue 40, item 10). It is cut like any other body.
func TestHTTPServerCutsTrickledBodiesOfRefusedRequests(t *testing.T) {
	refuse := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/close" {
			r.Body.Close() // a handler that closes the body unread: the server discards the rest
		}
		http.Error(w, "misdirected: foreign Host", http.StatusMisdirectedRequest)
	})
	addr := serveHandlerWithLimits(t, refuse, "--min-body-rate", "1000", "--min-body-rate-grace", "300ms")
	// And the gateway itself in open mode, which answers a foreign Host 421 (the reported case).
	gw, err := gateway.New(gateway.Options{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	gwAddr := serveHandlerWithLimits(t, gw, "--min-body-rate", "1000", "--min-body-rate-grace", "300ms")
	for _, tc := range []struct{ addr, path, length string }{{addr, "/", "100000"}, {addr, "/close", "100000"}, {addr, "/", "10000000"},
		{gwAddr, "/api/v1/create_session", "100000"}} {
		addr := tc.addr
		path := tc.path
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Length: "+tc.length+"\r\n\r\n")
		go func() {
			for range 500 {
				if _, err := c.Write([]byte{'x'}); err != nil {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
		start := time.Now()
		got := readUntilClosed(t, c)
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("%s: the trickle held its connection %s", path, d)
		}
		if addr == gwAddr && !strings.Contains(got, "421") {
			t.Fatalf("the gateway under a foreign Host: %q; want its 421", got)
		}
	}
}

// The liveness/readiness probe (GET /api/v1/healthz, what the Helm chart probes) is answered
// even while the connection caps are full: a flood that fills --max-conns must not make the
// kubelet restart the pod (issue 40, item 12). Any other request over the cap is still a 503.
func TestHTTPServerAnswersProbesOverTheConnectionCap(t *testing.T) {
	addr := serveWithLimits(t, "--max-conns", "2", "--max-conns-per-ip", "0")
	fillAndProbe(t, addr, "ok")
	// The gateway's own handler answers it, as in a pod (keys mode, the pod's address as Host).
	gw, err := gateway.New(gateway.Options{DataDir: t.TempDir(), Auth: gateway.AuthKeys})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	fillAndProbe(t, serveHandlerWithLimits(t, gw, "--max-conns", "2", "--max-conns-per-ip", "0"), `"status":"ok"`)

	// A flood from one address that sends nothing over the cap holds a few probe slots, not all of
	// them: the kubelet's probe from another address is still answered at once.
	for range 2 * reservedProbeSlots {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Skip("no second loopback address here:", err)
	}
	defer c.Close()
	start := time.Now()
	_, _ = io.WriteString(c, "GET /api/v1/healthz HTTP/1.1\r\nHost: 10.0.0.7:8080\r\n\r\n")
	if got := readUntilClosed(t, c); !strings.HasPrefix(got, "HTTP/1.1 200") || time.Since(start) > probeReadTimeout/2 {
		t.Fatalf("a probe from another address during a silent flood: %q after %s; want 200 at once", got, time.Since(start))
	}
}

// The kubelet probes liveness, readiness and startup on timers of their own, from one address
// (the node's): probes from one address that overlap are all answered while the cap is full, as
// is one sent right after the last was answered (the old code kept one slot per address, and
// gave it back only after closing the connection: the second of two overlapping probes got the
// 503, and so, now and then, did one sent right after an answer).
func TestOverlappingProbesFromOneAddressAreAllAnswered(t *testing.T) {
	addr := serveWithLimits(t, "--max-conns", "2", "--max-conns-per-ip", "0")
	defer fillCap(t, addr)()
	for round := range 20 {
		// Every probe connection is open (accepted and waiting) before any sends its request.
		var conns []net.Conn
		for range probeSlotsPerAddress {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		time.Sleep(20 * time.Millisecond)
		for _, c := range conns {
			_, _ = io.WriteString(c, "GET /api/v1/healthz HTTP/1.1\r\nHost: 10.0.0.7:8080\r\nUser-Agent: kube-probe/1.31\r\n\r\n")
		}
		for i, c := range conns {
			if got := readUntilClosed(t, c); !strings.HasPrefix(got, "HTTP/1.1 200") {
				t.Fatalf("round %d: probe %d of %d overlapping ones from one address: %q; want 200", round, i+1, len(conns), got)
			}
			c.Close()
		}
	}
}

// fillCap opens the two connections the server at addr may have, each answered; the func it
// returns closes them.
func fillCap(t *testing.T, addr string) (closeAll func()) {
	t.Helper()
	var conns []net.Conn
	closeAll = func() {
		for _, c := range conns {
			c.Close()
		}
	}
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			closeAll()
			t.Fatal(err)
		}
		conns = append(conns, c)
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusOK {
			closeAll()
			t.Fatalf("a connection within the cap: %v %v", resp, err)
		}
	}
	return closeAll
}

// fillAndProbe holds the two connections the server at addr may have, then probes it over the
// cap: GET and HEAD of the health path answer 200 (GET with a body ending in want), anything else 503.
func fillAndProbe(t *testing.T, addr, want string) {
	t.Helper()
	defer fillCap(t, addr)()
	for _, m := range []string{"GET", "HEAD"} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(c, m+" /api/v1/healthz HTTP/1.1\r\nHost: 10.0.0.7:8080\r\nUser-Agent: kube-probe/1.31\r\n\r\n")
		if got := readUntilClosed(t, c); !strings.HasPrefix(got, "HTTP/1.1 200") {
			t.Fatalf("%s healthz with the cap full: %q; want 200", m, got)
		} else if m == "GET" && !strings.Contains(got[strings.Index(got, "\r\n\r\n"):], want) {
			t.Fatalf("healthz with the cap full: %q; want the handler's answer", got)
		}
		c.Close()
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET /api/v1/asample HTTP/1.1\r\nHost: x\r\n\r\n")
	if got := readUntilClosed(t, c); !strings.Contains(got, "503") {
		t.Fatalf("another request with the cap full: %q; want 503", got)
	}
}

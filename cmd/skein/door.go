package main

// The HTTP door: what a client must do to keep a connection. Go's http.Server already closes a
// connection that sends nothing (ReadHeaderTimeout runs from the moment it waits for a request,
// the first one included) and an idle keep-alive (IdleTimeout); ReadTimeout bounds a whole
// request. What it lacks, and this file adds, is a floor on how fast a body must come (else a
// client trickling one byte a second holds its connection, and the handler's goroutine and
// buffers, for the whole ReadTimeout) and caps on how many connections are held at once.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

const (
	defaultMinBodyRate      = 4096 // bytes/s: a 32 kbit/s link; real clients send far faster
	defaultMinBodyRateGrace = 10 * time.Second
	defaultMaxConns         = 4096
	defaultMaxConnsPerIP    = 256 // an SDK's connection pool is tens; a proxy's address needs 0
)

// minRateBodies makes every request body of h arrive at an average of at least rate bytes/s once
// grace has passed since the handler began reading it. It works through read deadlines
// (http.ResponseController), because a body reader alone cannot cut a client that sends nothing:
// its Read blocks until a byte comes. Before each read the deadline is the moment the body
// would fall below the rate if nothing more came: first read + grace + bytes so far / rate.
// Counting from the first read, not from the request's arrival, keeps a handler that is slow to
// start reading from being blamed on its client. Bytes sent early earn time later (a client may
// send half fast and pause), which ReadTimeout still bounds. When the body ends the deadline goes
// back to the request's whole-read deadline: a deadline that passed while a handler waits (the
// 30 s long-poll) would end the request's context, and the limit is on reading, never on the
// time the server takes to answer.
func minRateBodies(h http.Handler, rate int, grace, readTimeout time.Duration) http.Handler {
	if rate <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			var restore time.Time // zero: no deadline, as the server had without a ReadTimeout
			if readTimeout > 0 {
				restore = time.Now().Add(readTimeout)
			}
			b := &minRateBody{body: r.Body, rc: http.NewResponseController(w), rate: rate, grace: grace, restore: restore, length: r.ContentLength}
			r.Body = b
			// After the handler, before the server sends its (buffered) answer: what is left of
			// the body is read under the rate, and the server gets its own body back, so that it
			// decides from the body's state (unread past 256 KiB, closed early, cut) whether the
			// connection can be kept; behind this wrapper it would discard 256 KiB of any body,
			// under the connection's old deadline, and keep a connection whose body was closed early.
			defer func() { b.drain(); r.Body = b.body }()
		}
		h.ServeHTTP(w, r)
	})
}

// maxPostHandlerDrain is what Go's server itself discards of a body the handler left unread
// (net/http's maxPostHandlerReadBytes); past it the server closes the connection instead.
const maxPostHandlerDrain = 256 << 10

// drain reads what the handler left of the body, up to what the server would discard, through
// the rate's deadline. Without it Go's server discards the rest itself on the connection's read
// deadline alone (the whole --http-read-timeout), so a handler that refuses a request without
// reading its body (a foreign Host's 421, a 401) let a trickled body hold its connection.
func (b *minRateBody) drain() {
	if b.done || (b.length >= 0 && b.length-b.n > maxPostHandlerDrain) {
		return // read to the end, not a connection whose deadline we can set, or the server will close it
	}
	if _, err := io.CopyN(io.Discard, b, maxPostHandlerDrain); err != nil && err != io.EOF {
		return // cut (below the rate) or broken: the server closes the connection
	}
}

type minRateBody struct {
	body    io.ReadCloser
	rc      *http.ResponseController
	rate    int
	grace   time.Duration
	restore time.Time // the deadline to leave behind once the body is read
	length  int64     // Content-Length, -1 if unknown

	start    time.Time // first Read
	n        int64     // bytes read so far
	done     bool      // the deadline is restored (or cannot be set): reads pass straight through
	deadline time.Time // the rate's deadline, kept to tell its timeout from others
	cut      bool      // the body fell below the rate: its deadline stays passed, so the connection goes
}

func (b *minRateBody) Read(p []byte) (int, error) {
	if b.done {
		return b.body.Read(p)
	}
	now := time.Now()
	if b.start.IsZero() {
		b.start = now
	}
	b.deadline = b.start.Add(b.grace + time.Duration(float64(b.n)/float64(b.rate)*float64(time.Second)))
	if !b.restore.IsZero() && b.restore.Before(b.deadline) {
		b.deadline = b.restore // never later than ReadTimeout would allow
	}
	if err := b.rc.SetReadDeadline(b.deadline); err != nil {
		b.done = true // not a connection of ours (HTTP/2, a test recorder): no rate, nothing else changes
		return b.body.Read(p)
	}
	n, err := b.body.Read(p)
	b.n += int64(n)
	switch {
	case err == io.EOF:
		b.finish()
	case err != nil && !time.Now().Before(b.deadline) && (b.restore.IsZero() || b.deadline.Before(b.restore)):
		b.cut = true
		return n, fmt.Errorf("request body arrived slower than %d bytes/s (%d bytes in %s): %w", b.rate, b.n, time.Since(b.start).Round(time.Millisecond), err)
	}
	return n, err
}

// finish puts back the request's own read deadline once the body is read or dropped.
func (b *minRateBody) finish() {
	if !b.done && !b.cut {
		b.done = true
		_ = b.rc.SetReadDeadline(b.restore)
	}
}

func (b *minRateBody) Close() error {
	b.drain() // net/http's Close discards up to 256 KiB of the rest: under the rate, not without it
	b.finish()
	return b.body.Close()
}

// connCaps is a listener that holds at most max connections open, and at most perIP from one
// remote address (0: no per-address cap). A connection over a cap is answered 503 and closed at
// once, so it holds nothing while a slow client would have held its place.
type connCaps struct {
	net.Listener
	max, perIP int
	probe      http.Handler // answers probePaths over the caps (nil: none)

	mu        sync.Mutex
	total     int
	byIP      map[string]int
	probing   int            // connections over the caps being read for a probe
	probingIP map[string]int // their addresses: at most probeSlotsPerAddress slots each
}

// Probes over the caps: the Helm chart's liveness, readiness and startup probes GET
// /api/v1/healthz, and a pod whose probes fail is restarted, so a flood that fills --max-conns
// must not fail them. A connection over a cap is read for its request line (at most
// probeHeadBytes, within probeReadTimeout) on one of reservedProbeSlots slots, at most
// probeSlotsPerAddress per remote address (so one flooding address holds a few slots, and the
// kubelet's address keeps its own); a
// probe path is answered by the server's own handler, once, and the connection closed; anything
// else, or a connection over the cap while its address or every slot is busy, gets the 503 at
// once as before.
var probePaths = map[string]bool{"/api/v1/healthz": true}

const (
	reservedProbeSlots = 16
	// probeSlotsPerAddress: the kubelet's liveness, readiness and startup probes come from one
	// address (the node's) on timers of their own, and may overlap.
	probeSlotsPerAddress = 3
	probeReadTimeout     = time.Second
	probeHeadBytes       = 8 << 10
	probeAnswerBytes     = 64 << 10
)

func limitConns(ln net.Listener, max, perIP int, probe http.Handler) net.Listener {
	return &connCaps{Listener: ln, max: max, perIP: perIP, probe: probe, byIP: map[string]int{}, probingIP: map[string]int{}}
}

func (l *connCaps) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := remoteIP(c)
		l.mu.Lock()
		var refused string
		switch {
		case l.total >= l.max:
			refused = fmt.Sprintf("the server holds its %d connections (--max-conns)", l.max)
		case l.perIP > 0 && l.byIP[ip] >= l.perIP:
			refused = fmt.Sprintf("%s holds %d connections, the most one address may (--max-conns-per-ip)", ip, l.perIP)
		default:
			l.total++
			l.byIP[ip]++
		}
		probe := refused != "" && l.probe != nil && l.probing < reservedProbeSlots && l.probingIP[ip] < probeSlotsPerAddress
		if probe {
			l.probing++
			l.probingIP[ip]++
		}
		l.mu.Unlock()
		switch {
		case refused == "":
			return &cappedConn{Conn: c, l: l, ip: ip}, nil
		case probe:
			go func() {
				// The slot is given back before the connection closes: a prober that sends its
				// next probe once it sees the close finds its slot free.
				defer c.Close()
				answerProbeOrRefuse(c, l.probe, refused)
				l.mu.Lock()
				l.probing--
				if l.probingIP[ip]--; l.probingIP[ip] <= 0 {
					delete(l.probingIP, ip)
				}
				l.mu.Unlock()
			}()
		default:
			go refuseConn(c, refused) // never let one refused client hold up Accept
		}
	}
}

// answerProbeOrRefuse reads one request head from a connection over a cap; a GET or HEAD of a
// probe path is answered by h, anything else gets the 503. The caller closes the connection.
func answerProbeOrRefuse(c net.Conn, h http.Handler, why string) {
	_ = c.SetReadDeadline(time.Now().Add(probeReadTimeout))
	req, err := http.ReadRequest(bufio.NewReaderSize(io.LimitReader(c, probeHeadBytes), 4096))
	if err != nil || (req.Method != http.MethodGet && req.Method != http.MethodHead) || !probePaths[req.URL.Path] ||
		req.ContentLength != 0 {
		refuseConn(c, why)
		return
	}
	req.RemoteAddr = c.RemoteAddr().String()
	ctx, cancel := context.WithTimeout(req.Context(), probeReadTimeout)
	defer cancel()
	pw := &probeWriter{header: http.Header{}, status: http.StatusOK}
	h.ServeHTTP(pw, req.WithContext(ctx))
	body := pw.body.Bytes()
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", pw.status, http.StatusText(pw.status))
	pw.header.Del("Content-Length")
	pw.header.Del("Connection")
	_ = pw.header.Write(&b)
	fmt.Fprintf(&b, "Content-Length: %d\r\nConnection: close\r\n\r\n", len(body))
	if req.Method == http.MethodGet {
		b.Write(body)
	}
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(b.Bytes())
}

// probeWriter holds a probe's answer (at most probeAnswerBytes of body) until the handler is done.
type probeWriter struct {
	header      http.Header
	status      int
	wroteHeader bool
	body        bytes.Buffer
}

func (p *probeWriter) Header() http.Header { return p.header }

func (p *probeWriter) WriteHeader(code int) {
	if !p.wroteHeader {
		p.status, p.wroteHeader = code, true
	}
}

func (p *probeWriter) Write(b []byte) (int, error) {
	p.WriteHeader(http.StatusOK)
	if p.body.Len()+len(b) > probeAnswerBytes {
		return 0, fmt.Errorf("probe answer over %d bytes", probeAnswerBytes)
	}
	return p.body.Write(b)
}

// refuseConn answers a connection over a cap with a 503 and closes it.
func refuseConn(c net.Conn, why string) {
	defer c.Close()
	msg := "too many connections: " + why + "; retry later\n"
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s", len(msg), msg)
}

func (l *connCaps) release(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip) // the map holds only addresses with connections open
	}
}

func remoteIP(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// cappedConn gives its place back when closed (once, however often Close is called).
type cappedConn struct {
	net.Conn
	l    *connCaps
	ip   string
	once sync.Once
}

func (c *cappedConn) Close() error {
	c.once.Do(func() { c.l.release(c.ip) })
	return c.Conn.Close()
}

// listener wraps ln with the connection caps of these flags; h (the server's handler) answers
// probes over the caps.
func (l *limitFlags) listener(ln net.Listener, h http.Handler) net.Listener {
	return limitConns(ln, *l.maxConns, *l.maxConnsPerIP, h)
}

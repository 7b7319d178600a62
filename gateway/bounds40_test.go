package gateway_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/gateway"
)

// An OpenAI request over the body limit gets a 413 that a client sending its whole body before
// reading (curl, requests, most SDKs) can read: the server reads and discards the rest of the
// body (up to gateway.MaxDiscardBytes) before answering, instead of closing a connection with
// unread bytes, which resets it and loses the answer (issue 40, item 16).
func TestOversizedBodyGetsAReadable413(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	addr := strings.TrimPrefix(ts.URL, "http://")
	size := 32 << 20
	for _, chunked := range []bool{false, true} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Minute))
		head := "POST /v1/completions HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: Bearer tml-big\r\nContent-Type: application/json\r\n"
		if chunked {
			head += "Transfer-Encoding: chunked\r\n\r\n"
		} else {
			head += fmt.Sprintf("Content-Length: %d\r\n\r\n", size)
		}
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatal(err)
		}
		chunk := []byte(`{"model":"x","prompt":"` + strings.Repeat("a", 1<<20-23))
		for sent := 0; sent < size; sent += len(chunk) {
			var err error
			if chunked {
				_, err = fmt.Fprintf(c, "%x\r\n%s\r\n", len(chunk), chunk)
			} else {
				_, err = c.Write(chunk)
			}
			if err != nil {
				t.Fatalf("chunked %v: writing the body after %d bytes: %v (the server reset the connection)", chunked, sent, err)
			}
			chunk = []byte(strings.Repeat("a", 1<<20))
			time.Sleep(40 * time.Millisecond) // 25 MB/s: a real link, slower than loopback
		}
		if chunked {
			_, _ = io.WriteString(c, "0\r\n\r\n")
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("chunked %v: reading the answer: %v", chunked, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "limit") {
			t.Fatalf("chunked %v: %d %s; want a 413 naming the limit", chunked, resp.StatusCode, b)
		}
	}
}

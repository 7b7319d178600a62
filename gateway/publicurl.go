package gateway

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Links the server hands out (archive downloads) are built from its configured public URL,
// never from a request's Host header, which the client chooses: a forged Host would otherwise
// make the server sign links that point elsewhere.

// checkPublicURL validates Options.PublicURL.
func checkPublicURL(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("public URL %q: want http(s)://host[:port][/prefix]", s)
	}
	return nil
}

// publicBase is the URL prefix of links handed out for r: the configured public URL, or the
// loopback address r came in on (a server on loopback is reached at the address it listens on).
func (s *Server) publicBase(r *http.Request) (string, error) {
	if s.opts.PublicURL != "" {
		return strings.TrimRight(s.opts.PublicURL, "/"), nil
	}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok && a.IP.IsLoopback() {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		return scheme + "://" + a.String(), nil
	}
	return "", errf(http.StatusNotImplemented, "download links need this server's public URL: start it with --public-url "+
		"(or SKEIN_PUBLIC_URL), e.g. --public-url https://skein.example.com")
}

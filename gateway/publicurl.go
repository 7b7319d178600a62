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

// openModeHostOK says whether an open-mode server answers a request with this Host header. Open
// mode trusts any key, so its only defence is that it listens on loopback; a web page the user
// visits can still reach it through DNS rebinding (evil.example resolving to 127.0.0.1), and such
// requests carry the page's name as Host. Loopback names (localhost, *.localhost, 127.0.0.0/8,
// ::1) and the public URL's host, with any port, are all a local client ever needs.
func (s *Server) openModeHostOK(host string) bool {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(name, "["), "]"))
	name = strings.TrimSuffix(name, ".") // "localhost." is the same name
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	if ip := net.ParseIP(name); ip != nil && ip.IsLoopback() {
		return true
	}
	if s.opts.PublicURL != "" {
		if u, err := url.Parse(s.opts.PublicURL); err == nil && strings.EqualFold(u.Hostname(), name) {
			return true
		}
	}
	return false
}

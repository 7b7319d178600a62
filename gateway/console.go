package gateway

// The web console: a page at / (and its assets under /console/) embedded in the binary. It is
// plain HTML and JavaScript over the public REST API with the caller's own key, so it can show
// and do only what that key may (gateway/console/console.js).

import (
	"bytes"
	"embed"
	"fmt"
	"net/http"
)

//go:embed console
var consoleFiles embed.FS

// consoleHeaders keep the page from being framed or sniffed, and let it run only its own
// script and talk only to this gateway: the key lives in the page's sessionStorage.
func consoleHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
}

// routeConsole serves the console at / exactly and its assets under /console/; every other
// path keeps the JSON 404 of the catch-all route.
func (s *Server) routeConsole() {
	files := http.FileServerFS(consoleFiles) // /console/x is console/x in the embedded tree
	s.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		index, err := consoleFiles.ReadFile("console/index.html")
		if err != nil {
			writeError(w, http.StatusInternalServerError, fmt.Sprintf("console page: %v", err))
			return
		}
		consoleHeaders(w)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(bytes.Replace(index, []byte("<!--key-hint-->"), []byte(s.keyHint()), 1))
	})
	s.mux.HandleFunc("GET /console/", func(w http.ResponseWriter, r *http.Request) {
		consoleHeaders(w)
		files.ServeHTTP(w, r)
	})
	s.handle("GET "+v1+"console/whoami", true, s.whoami)
}

// keyHint is the console's first-page line on which key to enter (fixed HTML, nothing from a
// request): in open mode any key, and the key is the tenant, so the one the scripts use.
func (s *Server) keyHint() string {
	if s.opts.Auth == AuthKeys {
		return "Enter an API key the operator issued (<code>skein keys create</code>); an admin key also shows the fleet."
	}
	return "Open mode (a server on loopback): any key works, e.g. <code>tml-me</code>. Each key is its own tenant, " +
		"so enter the <code>api_key</code> your scripts use to see their runs."
}

// consoleWhoami says what the calling key is, so the console shows the panels it may use
// (the fleet panel only to a key the fleet endpoints accept) instead of probing for a 403.
type consoleWhoami struct {
	Tenant string `json:"tenant"`
	Admin  bool   `json:"admin"` // may read /api/v1/skein/replicas: an admin key, or anyone in open mode
	Auth   string `json:"auth"`  // "open" or "keys"
}

func (s *Server) whoami(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	auth := s.opts.Auth
	if auth != AuthKeys {
		auth = AuthOpen
	}
	return consoleWhoami{Tenant: tenant, Admin: callerOf(r).admin, Auth: auth}, nil
}

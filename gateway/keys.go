package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/store"
)

// Auth modes (Options.Auth).
const (
	// AuthOpen: any non-empty key is a tenant (a hash of the key). Safe only on loopback.
	AuthOpen = "open"
	// AuthKeys: only keys issued by `skein keys create` or POST /api/v1/skein/keys, unrevoked.
	AuthKeys = "keys"
)

// An issued key is "tml-" + id (16 hex) + "_" + secret (64 hex, 256 random bits). The id finds
// the row by primary key, so no lookup scans; the store keeps SHA-256 of the whole key, compared
// in constant time. A plain SHA-256 suffices because the secret has 256 bits of entropy: a salt or
// a server-side HMAC key only helps against guessing low-entropy secrets, and leaving them out
// means every gateway on one PostgreSQL, and the `skein keys` command, need nothing but the store.
const (
	keyPrefix    = "tml-"
	keyIDHex     = 16
	keySecretHex = 64
	maxKeyName   = 64
)

// ErrInvalidKeyName is a key name that is empty, too long or not printable.
var ErrInvalidKeyName = errors.New("invalid key name")

// IssueKey creates a key in the store and returns it; it is shown once and never stored.
func IssueKey(ctx context.Context, st interface {
	CreateKey(context.Context, store.APIKey) error
}, name string, admin bool) (string, store.APIKey, error) {
	if err := validKeyName(name); err != nil {
		return "", store.APIKey{}, err
	}
	id, secret := randomHex(keyIDHex/2), randomHex(keySecretHex/2)
	key := keyPrefix + id + "_" + secret
	sum := sha256.Sum256([]byte(key))
	row := store.APIKey{ID: id, Name: name, Hash: sum[:], Admin: admin, Created: time.Now().UTC().Truncate(time.Millisecond)}
	if err := st.CreateKey(ctx, row); err != nil {
		return "", store.APIKey{}, fmt.Errorf("issuing key %q: %w", name, err)
	}
	return key, row, nil
}

// KeyTenant is the tenant of an issued key: derived from its id, so it never changes while the
// key lives, and distinct from open mode's hashed tenants ("t-…").
func KeyTenant(id string) string { return "k-" + id }

func validKeyName(name string) error {
	if name == "" || len(name) > maxKeyName {
		return fmt.Errorf("%w: want 1 to %d bytes, got %d", ErrInvalidKeyName, maxKeyName, len(name))
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%w: %q has a non-printable character", ErrInvalidKeyName, name)
		}
	}
	return nil
}

// keyID returns the id of a well-formed issued key.
func keyID(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, keyPrefix)
	if !ok || len(rest) != keyIDHex+1+keySecretHex || rest[keyIDHex] != '_' ||
		!isLowerHex(rest[:keyIDHex]) || !isLowerHex(rest[keyIDHex+1:]) {
		return "", false
	}
	return rest[:keyIDHex], true
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// checkAuthMode defaults Options.Auth to open and refuses unknown modes.
func checkAuthMode(opts *Options) error {
	switch opts.Auth {
	case "":
		opts.Auth = AuthOpen
	case AuthOpen, AuthKeys:
	default:
		return fmt.Errorf("gateway: auth mode %q: want %q or %q", opts.Auth, AuthOpen, AuthKeys)
	}
	return nil
}

// keyRows is what the keyring reads and writes of the store: the API keys' rows.
type keyRows interface {
	CreateKey(ctx context.Context, k store.APIKey) error
	GetKey(ctx context.Context, id string) (store.APIKey, error)
	Keys(ctx context.Context) ([]store.APIKey, error)
	RevokeKey(ctx context.Context, id string, at time.Time) error
}

// keyring is the gateway's authority on callers: it authenticates every request, guards the
// admin endpoints and serves the key-management ones. A resource of its own (issue 38 item 6),
// it needs the key rows, the auth mode, a log, the audit trail and the JSON decoder, nothing
// else of the server.
type keyring struct {
	rows   keyRows
	mode   string // AuthOpen or AuthKeys
	log    *slog.Logger
	audit  func(tenant, event, modelID, tinkerPath, purpose string)
	decode func(r *http.Request, v any) error
}

// warnWithoutAdminKey tells the operator of a keys-mode server that nobody can manage it yet.
func (kr *keyring) warnWithoutAdminKey() {
	if kr.mode != AuthKeys {
		return
	}
	keys, err := kr.rows.Keys(context.Background())
	if err != nil {
		kr.log.Warn("listing API keys", "err", err)
		return
	}
	for _, k := range keys {
		if k.Admin && k.Revoked == nil {
			return
		}
	}
	kr.log.Warn("--auth keys with no admin key: create one with `skein keys create --name NAME --admin` on this server's --data or --state")
}

// writeAuthError answers a failed authentication (always an httpError; 401 otherwise).
func writeAuthError(w http.ResponseWriter, err error) {
	var he *httpError
	if !errors.As(err, &he) {
		he = &httpError{status: http.StatusUnauthorized, msg: err.Error()}
	}
	writeError(w, he.status, he.msg)
}

// caller is who sent a request: its tenant, and whether it may use the fleet endpoints.
type caller struct {
	tenant string
	admin  bool
	keyID  string // the issued key's id in keys mode (download links name it); empty in open mode
}

type callerCtxKey struct{}

// authenticate finds the caller. Open mode is today's behaviour (every caller is a tenant and may
// read the fleet endpoints). Keys mode reads the key's row on every request, with no cache, so a
// revocation applies to the next request on every gateway sharing the store.
func (kr *keyring) authenticate(r *http.Request) (caller, error) {
	if kr.mode != AuthKeys {
		tenant, err := tenantOf(r)
		if err != nil {
			return caller{}, errf(http.StatusUnauthorized, "%v", err)
		}
		return caller{tenant: tenant, admin: true}, nil
	}
	key := apiKeyOf(r)
	if key == "" {
		return caller{}, errf(http.StatusUnauthorized, "missing API key: send X-API-Key (or Authorization: Bearer)")
	}
	invalid := errf(http.StatusUnauthorized, "invalid API key: this server accepts only keys issued by `skein keys create`")
	id, ok := keyID(key)
	if !ok {
		return caller{}, invalid
	}
	row, err := kr.rows.GetKey(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return caller{}, invalid
	}
	if err != nil {
		kr.log.Error("reading an API key", "key_id", id, "err", err)
		return caller{}, errf(http.StatusServiceUnavailable, "cannot check the API key now; retry")
	}
	sum := sha256.Sum256([]byte(key))
	if subtle.ConstantTimeCompare(sum[:], row.Hash) != 1 {
		return caller{}, invalid
	}
	if row.Revoked != nil {
		return caller{}, errf(http.StatusUnauthorized, "API key %s was revoked", id)
	}
	return caller{tenant: KeyTenant(id), admin: row.Admin, keyID: id}, nil
}

// withCaller authenticates a request for the handlers that need its caller.
func (kr *keyring) withCaller(r *http.Request) (*http.Request, caller, error) {
	c, err := kr.authenticate(r)
	if err != nil {
		return r, caller{}, err
	}
	if info := infoOf(r); info != nil { // the request log's record: no second copy of the request
		info.caller, info.authenticated = c, true
		return r, c, nil
	}
	return r.WithContext(context.WithValue(r.Context(), callerCtxKey{}, c)), c, nil
}

func callerOf(r *http.Request) caller {
	if info := infoOf(r); info != nil && info.authenticated {
		return info.caller
	}
	c, _ := r.Context().Value(callerCtxKey{}).(caller)
	return c
}

var errNeedsAdmin = errf(http.StatusForbidden, "this endpoint needs an admin key (`skein keys create --admin`)")

// adminOnly guards a fleet endpoint: in keys mode a tenant's key gets 403.
func (kr *keyring) adminOnly(fn handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
		if !callerOf(r).admin {
			return nil, errNeedsAdmin
		}
		return fn(w, r, tenant)
	}
}

// adminHTTP guards a plain handler (/metrics): open in open mode, as today; admin keys only in
// keys mode.
func (kr *keyring) adminHTTP(fn http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if kr.mode == AuthKeys {
			c, err := kr.authenticate(r)
			if err == nil && !c.admin {
				err = errNeedsAdmin
			}
			if err != nil {
				writeAuthError(w, err)
				return
			}
		}
		fn(w, r)
	}
}

// capacityFor answers GET /api/v1/skein/capacity: the fleet's slots for an admin (and for
// everyone in open mode); in keys mode a tenant's key sees only its own adapter counts, since the
// fleet's reveal other tenants' activity.
func (s *Server) capacityFor(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	if callerOf(r).admin {
		return s.capacity(w, r, tenant)
	}
	live := 0
	s.runs.mu.Lock()
	for _, run := range s.runs.m {
		if run.tenant == tenant && run.ready {
			live++
		}
	}
	s.runs.mu.Unlock()
	return api.CapacityResponse{Tenant: tenant, LiveLoras: live, MaxLoras: s.opts.MaxAdaptersPerTenant}, nil
}

// keysOnly refuses key management in open mode, where anyone reaching the port could otherwise
// mint the admin key a later `--auth keys` start would honour.
func (kr *keyring) keysOnly(fn handlerFunc) handlerFunc {
	admin := kr.adminOnly(fn)
	return func(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
		if kr.mode != AuthKeys {
			return nil, errf(http.StatusForbidden, "key management needs --auth keys (use `skein keys` on the server's state store)")
		}
		return admin(w, r, tenant)
	}
}

// KeyInfo is a key as listed: never its secret or hash.
type KeyInfo = api.KeyInfo

// KeyInfoOf lists a stored key.
func KeyInfoOf(k store.APIKey) KeyInfo {
	return KeyInfo{ID: k.ID, Name: k.Name, Admin: k.Admin, Tenant: KeyTenant(k.ID), Created: k.Created, Revoked: k.Revoked}
}

func (kr *keyring) createKey(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.CreateKeyRequest
	if err := kr.decode(r, &req); err != nil {
		return nil, err
	}
	key, row, err := IssueKey(r.Context(), kr.rows, req.Name, req.Admin)
	if errors.Is(err, ErrInvalidKeyName) {
		return nil, errf(http.StatusBadRequest, "%v", err)
	}
	if err != nil {
		return nil, err
	}
	kr.log.Info("API key created", "key_id", row.ID, "name", row.Name, "admin", row.Admin)
	kr.audit(tenant, "api_key.create", "", "", "key "+row.ID)
	return api.CreatedKey{KeyInfo: KeyInfoOf(row), Key: key}, nil
}

func (kr *keyring) listKeys(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	rows, err := kr.rows.Keys(r.Context())
	if err != nil {
		return nil, fmt.Errorf("listing keys: %w", err)
	}
	out := []KeyInfo{}
	for _, k := range rows {
		out = append(out, KeyInfoOf(k))
	}
	return api.KeysResponse{Keys: out}, nil
}

func (kr *keyring) revokeKey(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	id := r.PathValue("id")
	err := kr.rows.RevokeKey(r.Context(), id, time.Now())
	if errors.Is(err, store.ErrNotFound) {
		return nil, errf(http.StatusNotFound, "no key %q", id)
	}
	if err != nil {
		return nil, fmt.Errorf("revoking key %s: %w", id, err)
	}
	kr.log.Info("API key revoked", "key_id", id)
	kr.audit(tenant, "api_key.revoke", "", "", "key "+id)
	return api.RevokeKeyResponse{ID: id, Revoked: true}, nil
}

// scope is whose events (audit entries, usage records) a caller reads: its own, or everyone's ("") for an admin key in
// keys mode (in open mode every caller counts as admin for the fleet endpoints, but tenants
// still never read each other's logs).
func (kr *keyring) scope(r *http.Request, tenant string) string {
	if kr.mode == AuthKeys && callerOf(r).admin {
		return ""
	}
	return tenant
}

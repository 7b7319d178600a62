package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/skein-ai/skein/store"
)

// fakeKeyRows is the keyring's store in memory; fail makes every read fail as a store that
// cannot answer.
type fakeKeyRows struct {
	rows map[string]store.APIKey
	fail error
}

func (f *fakeKeyRows) CreateKey(_ context.Context, k store.APIKey) error {
	f.rows[k.ID] = k
	return nil
}

func (f *fakeKeyRows) GetKey(_ context.Context, id string) (store.APIKey, error) {
	if f.fail != nil {
		return store.APIKey{}, f.fail
	}
	k, ok := f.rows[id]
	if !ok {
		return store.APIKey{}, store.ErrNotFound
	}
	return k, nil
}

func (f *fakeKeyRows) Keys(context.Context) ([]store.APIKey, error) { return nil, f.fail }

func (f *fakeKeyRows) RevokeKey(_ context.Context, id string, at time.Time) error {
	k, ok := f.rows[id]
	if !ok {
		return store.ErrNotFound
	}
	k.Revoked = &at
	f.rows[id] = k
	return nil
}

// The keyring is a resource of its own: it authenticates with nothing of the server but its key
// rows. In keys mode a tenant's key is its tenant and not an admin, an admin key is both, and
// each way a key can fail is told apart: none sent and an unknown or malformed key are 401,
// a revoked key is 401 naming it, and a store that cannot answer is 503 (retry), never a 401
// that would make a client drop a good key.
func TestKeyringAuthenticates(t *testing.T) {
	rows := &fakeKeyRows{rows: map[string]store.APIKey{}}
	kr := &keyring{rows: rows, mode: AuthKeys, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		audit: func(string, string, string, string, string) {}}
	ctx := context.Background()
	tenantKey, tenantRow, err := IssueKey(ctx, rows, "tenant", false)
	if err != nil {
		t.Fatal(err)
	}
	adminKey, adminRow, err := IssueKey(ctx, rows, "ops", true)
	if err != nil {
		t.Fatal(err)
	}
	revokedKey, revokedRow, err := IssueKey(ctx, rows, "gone", false)
	if err != nil {
		t.Fatal(err)
	}
	if err := rows.RevokeKey(ctx, revokedRow.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	request := func(key string) *http.Request {
		r := httptest.NewRequest("GET", "/api/v1/skein/replicas", nil)
		if key != "" {
			r.Header.Set("X-API-Key", key)
		}
		return r
	}
	status := func(err error) int {
		var he *httpError
		if !errors.As(err, &he) {
			return 0
		}
		return he.status
	}
	c, err := kr.authenticate(request(tenantKey))
	if err != nil || c.tenant != KeyTenant(tenantRow.ID) || c.admin {
		t.Fatalf("a tenant's key: %+v, %v", c, err)
	}
	if c, err = kr.authenticate(request(adminKey)); err != nil || c.tenant != KeyTenant(adminRow.ID) || !c.admin {
		t.Fatalf("an admin key: %+v, %v", c, err)
	}
	last := "0"
	if tenantKey[len(tenantKey)-1] == '0' {
		last = "1"
	}
	for name, key := range map[string]string{"none": "", "unknown": "tml-0123456789abcdef_" + tenantKey[len(tenantKey)-64:],
		"malformed": "sk-not-ours", "revoked": revokedKey, "altered": tenantKey[:len(tenantKey)-1] + last} {
		if _, err := kr.authenticate(request(key)); status(err) != http.StatusUnauthorized {
			t.Errorf("%s key: %v, want 401", name, err)
		}
	}
	rows.fail = errors.New("connection refused")
	if _, err := kr.authenticate(request(tenantKey)); status(err) != http.StatusServiceUnavailable {
		t.Errorf("with the store down: %v, want 503", err)
	}
	rows.fail = nil

	// The admin guard: a tenant's key gets 403, an admin's goes through.
	guarded := kr.adminOnly(func(http.ResponseWriter, *http.Request, string) (any, error) { return "ok", nil })
	for key, want := range map[string]int{tenantKey: http.StatusForbidden, adminKey: 0} {
		r, _, err := kr.withCaller(request(key))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := guarded(httptest.NewRecorder(), r, ""); status(err) != want {
			t.Errorf("admin guard: %v, want status %d", err, want)
		}
	}
}

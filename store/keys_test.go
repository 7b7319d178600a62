package store

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// API keys: created once per id, found by id, listed in creation order, revoked once (the first
// revocation time stays), and a revoked key is still listed so operators see what was revoked.
func TestKeysContract(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Millisecond)
		hashA, hashB := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
		if _, err := s.GetKey(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("missing key: %v, want ErrNotFound", err)
		}
		if err := s.CreateKey(ctx, APIKey{ID: "a1", Name: "alice", Hash: hashA, Created: now}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateKey(ctx, APIKey{ID: "b2", Name: "ops", Hash: hashB, Admin: true, Created: now.Add(time.Second)}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateKey(ctx, APIKey{ID: "a1", Name: "mallory", Hash: hashB, Created: now}); !errors.Is(err, ErrExists) {
			t.Fatalf("second key with one id: %v, want ErrExists", err)
		}
		k, err := s.GetKey(ctx, "a1")
		if err != nil || k.Name != "alice" || !bytes.Equal(k.Hash, hashA) || k.Admin || !k.Created.Equal(now) || k.Revoked != nil {
			t.Fatalf("GetKey a1 = %+v, %v", k, err)
		}
		if k, err := s.GetKey(ctx, "b2"); err != nil || !k.Admin {
			t.Fatalf("GetKey b2 = %+v, %v", k, err)
		}
		if err := s.RevokeKey(ctx, "nope", now); !errors.Is(err, ErrNotFound) {
			t.Fatalf("revoking a missing key: %v, want ErrNotFound", err)
		}
		revokedAt := now.Add(time.Minute)
		if err := s.RevokeKey(ctx, "a1", revokedAt); err != nil {
			t.Fatal(err)
		}
		if err := s.RevokeKey(ctx, "a1", revokedAt.Add(time.Hour)); err != nil {
			t.Fatalf("revoking twice: %v", err)
		}
		if k, err := s.GetKey(ctx, "a1"); err != nil || k.Revoked == nil || !k.Revoked.Equal(revokedAt) {
			t.Fatalf("after revoke: %+v, %v", k, err)
		}
		keys, err := s.Keys(ctx)
		if err != nil || len(keys) != 2 || keys[0].ID != "a1" || keys[1].ID != "b2" || keys[0].Revoked == nil || keys[1].Revoked != nil {
			t.Fatalf("Keys = %+v, %v", keys, err)
		}
	})
}

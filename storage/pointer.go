package storage

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// A pointer is a small object naming the current version of something written as immutable
// versions (an adapter's saved state: state/<run>.current names state/<run>@<version>/). A
// writer writes its version first, under a key nobody else uses, then swaps the pointer with a
// conditional Put on the ETag it read (or holds from its own last swap). A writer that was cut
// off and still runs, whose view is old, then cannot replace newer state: its swap fails with
// *StaleError (ErrPrecondition) and what it wrote is an orphan version, removed later.

// MaxPointerBytes bounds a pointer object.
const MaxPointerBytes = 4096

// StaleError is a pointer swap refused because the pointer changed since the writer read it:
// another writer (the adapter's new replica) owns it now.
type StaleError struct {
	Key      string
	Expected string // the ETag the writer held ("" : it expected no pointer)
	Value    string // what it tried to write
}

func (e *StaleError) Error() string {
	exp := e.Expected
	if exp == "" {
		exp = "(none)"
	}
	return fmt.Sprintf("storage: pointer %s was changed by another writer since ETag %s; refusing to replace it with %q (412): this writer's view is stale", e.Key, exp, e.Value)
}

func (e *StaleError) Unwrap() error { return ErrPrecondition }

// ReadPointer reads a pointer: its value (its first line, trimmed) and ETag. ErrNotFound when
// there is none.
func ReadPointer(ctx context.Context, st Storage, key string) (value, etag string, err error) {
	value, etag, _, err = ReadPointerEpoch(ctx, st, key)
	return value, etag, err
}

// ReadPointerEpoch is ReadPointer with the epoch of the writer's lease that the pointer
// carries (0: none, as every pointer written without one). Gateways sequencing a run under a
// lease (issue 38) write their epoch, and one whose epoch is below the pointer's is stale.
func ReadPointerEpoch(ctx context.Context, st Storage, key string) (value, etag string, epoch int64, err error) {
	b, info, err := ReadAll(ctx, st, key, MaxPointerBytes)
	if err != nil {
		return "", "", 0, err
	}
	lines := strings.Split(string(b), "\n")
	for _, l := range lines[1:] {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "epoch "); ok {
			epoch, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return strings.TrimSpace(lines[0]), info.ETag, epoch, nil
}

// SwapPointer replaces the pointer at key with value if its ETag is still expect ("" : only if
// there is no pointer yet), and returns the new ETag, which differs from expect even when value
// does not (a claim rewrites the same value). A pointer changed meanwhile is *StaleError.
func SwapPointer(ctx context.Context, st Storage, key, value, expect string) (string, error) {
	return SwapPointerEpoch(ctx, st, key, value, expect, 0)
}

// SwapPointerEpoch is SwapPointer writing the writer's lease epoch too (0: none).
func SwapPointerEpoch(ctx context.Context, st Storage, key, value, expect string, epoch int64) (string, error) {
	cond := Cond{IfMatch: expect, IfAbsent: expect == ""}
	// A second line of fresh random bytes: S3's ETag is the content's MD5, so rewriting the same
	// value (a claim) would otherwise keep the ETag, and a stale writer's condition would hold.
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	body := value + "\nwrite " + hex.EncodeToString(nonce[:]) + "\n"
	if epoch > 0 {
		body += "epoch " + strconv.FormatInt(epoch, 10) + "\n"
	}
	info, err := st.Put(ctx, key, bytes.NewReader([]byte(body)), cond)
	if errors.Is(err, ErrPrecondition) {
		return "", &StaleError{Key: key, Expected: expect, Value: value}
	}
	if err != nil {
		return "", err
	}
	return info.ETag, nil
}

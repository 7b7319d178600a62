// Package storage is where skein keeps its bytes: adapter state, checkpoints, sampler weights,
// archives' contents and tokenizer files. One small interface (Storage) over two backends: a
// local directory (Dir: write, fsync, rename, fsync the directory) and S3-compatible object
// storage (S3). Keys are slash-separated paths relative to the backend's root (the data
// directory, or the bucket's prefix), checked by CheckKey before they reach a backend, so no key
// can name anything outside that root. It is a leaf package: it knows nothing of runs or tenants.
package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Storage is a flat key space of immutable-until-replaced objects.
type Storage interface {
	// Get opens an object for reading (ErrNotFound when it is absent).
	Get(ctx context.Context, key string) (io.ReadCloser, Info, error)
	// Put writes an object whole, atomically: a reader sees the old bytes or the new, never a mix.
	// cond makes it conditional (ErrPrecondition, in a *ConditionError, when it does not hold).
	Put(ctx context.Context, key string, body io.ReadSeeker, cond Cond) (Info, error)
	// Head describes an object without reading it (ErrNotFound when it is absent).
	Head(ctx context.Context, key string) (Info, error)
	// List returns the objects whose keys start with prefix, in key order, at most limit of them
	// (ErrTooMany when there are more: the caller chose a bound it must not silently exceed).
	List(ctx context.Context, prefix string, limit int) ([]Info, error)
	// Delete removes an object; an absent one is not an error.
	Delete(ctx context.Context, key string) error
	// PresignGet returns a URL that reads the object without credentials for ttl
	// (ErrNoPresign when the backend cannot make one: the local directory).
	PresignGet(ctx context.Context, key string, ttl time.Duration) (string, error)
	// String names the backend and its root for logs (never a credential).
	String() string
}

// Info describes one stored object.
type Info struct {
	Key      string
	Size     int64
	ETag     string // changes with every Put of the key; opaque
	Modified time.Time
}

// Cond makes a Put conditional, as HTTP's If-Match and If-None-Match: * do.
type Cond struct {
	IfMatch  string // write only if the object's current ETag is this one
	IfAbsent bool   // write only if no object has this key
}

func (c Cond) String() string {
	switch {
	case c.IfAbsent:
		return "if-none-match *"
	case c.IfMatch != "":
		return "if-match " + c.IfMatch
	}
	return "unconditional"
}

var (
	// ErrNotFound: no object has the key.
	ErrNotFound = errors.New("storage: no such object")
	// ErrPrecondition: a conditional Put's condition did not hold (HTTP 412): someone else wrote
	// the key since its ETag was read, or it exists where absence was required.
	ErrPrecondition = errors.New("storage: precondition failed (412)")
	// ErrBadKey: a key that is not a safe relative path (see CheckKey).
	ErrBadKey = errors.New("storage: bad key")
	// ErrNoPresign: the backend cannot make presigned URLs.
	ErrNoPresign = errors.New("storage: this backend has no presigned URLs")
	// ErrTooMany: a List found more objects than its limit.
	ErrTooMany = errors.New("storage: more objects than the limit")
	// ErrTooBig: an object larger than its reader's bound.
	ErrTooBig = errors.New("storage: object larger than allowed")
)

// ConditionError is a conditional write refused because its condition did not hold.
type ConditionError struct {
	Key  string
	Cond Cond
}

func (e *ConditionError) Error() string {
	return fmt.Sprintf("storage: %s: write refused, %s did not hold (412): another writer changed it", e.Key, e.Cond)
}

func (e *ConditionError) Unwrap() error { return ErrPrecondition }

// MaxKeyLen bounds a key (S3 allows 1024 bytes with the prefix; keep room for one).
const MaxKeyLen = 768

// MaxPresignTTL is the longest a presigned URL may live (S3's own limit for SigV4 is 7 days;
// skein's archive links are minutes).
const MaxPresignTTL = 24 * time.Hour

// CheckKey accepts a relative, slash-separated key whose elements are 1-255 characters of
// letters, digits and . _ - @ = +, none of them ".", "..", or starting with "." (names beginning
// with a dot are the backends' own: temporary files, locks). So a key can never climb out of
// the backend's root, name a hidden file, or carry a character a filesystem or URL treats
// specially. Tenant-chosen names reach keys only through checked formats (checkpoint.ValidName)
// and this check again.
func CheckKey(key string) error {
	if key == "" || len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %q: 1 to %d bytes", ErrBadKey, clip(key), MaxKeyLen)
	}
	for _, part := range strings.Split(key, "/") {
		if err := checkElement(part); err != nil {
			return fmt.Errorf("%w: %q: %v", ErrBadKey, clip(key), err)
		}
	}
	return nil
}

// CheckPrefix accepts a List prefix: "" (everything), or a key, optionally ending in "/".
func CheckPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return CheckKey(strings.TrimSuffix(prefix, "/"))
}

func checkElement(part string) error {
	switch {
	case part == "":
		return errors.New("empty element (a leading, trailing or doubled /)")
	case len(part) > 255:
		return errors.New("an element longer than 255 bytes")
	case part[0] == '.':
		return errors.New("an element starting with '.'")
	}
	for i := 0; i < len(part); i++ {
		c := part[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '-' || c == '@' || c == '=' || c == '+'
		if !ok {
			return fmt.Errorf("character %q not allowed", c)
		}
	}
	return nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// ReadAll reads a whole object of at most max bytes.
func ReadAll(ctx context.Context, st Storage, key string, max int64) ([]byte, Info, error) {
	rc, info, err := st.Get(ctx, key)
	if err != nil {
		return nil, Info{}, err
	}
	defer rc.Close()
	if info.Size > max {
		return nil, Info{}, fmt.Errorf("%w: %s is %d bytes, at most %d", ErrTooBig, key, info.Size, max)
	}
	b, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err != nil {
		return nil, Info{}, fmt.Errorf("storage: reading %s: %w", key, err)
	}
	if int64(len(b)) > max {
		return nil, Info{}, fmt.Errorf("%w: %s is more than %d bytes", ErrTooBig, key, max)
	}
	return b, info, nil
}

// Join joins key elements with "/"; the result still needs CheckKey.
func Join(parts ...string) string { return strings.Join(parts, "/") }

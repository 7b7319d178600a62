// Package store keeps skein's durable state: sessions, training runs, sampling sessions,
// checkpoint metadata and futures with their results. One interface; SQLite (pure Go, no cgo)
// is the embedded default. It is a leaf package: rows are plain structs and JSON blobs.
package store

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound is returned for a missing row.
var ErrNotFound = errors.New("not found")

// ErrExists is returned when creating a row whose key is taken.
var ErrExists = errors.New("already exists")

// Session is a client session.
type Session struct {
	ID, Tenant string
	Created    time.Time
	Heartbeat  time.Time
	Closed     bool
	Data       []byte // JSON: tags, user metadata
}

// Run is a training run (a LoRA model).
type Run struct {
	ID, Tenant, SessionID, BaseModel string
	Created, LastRequest             time.Time
	Live                             bool   // the adapter exists (not unloaded or expired)
	Data                             []byte // JSON: LoRA config, user metadata, last checkpoints
}

// Sampler is a sampling session.
type Sampler struct {
	ID, Tenant, SessionID string
	Data                  []byte // JSON: base model, model path, weights directory
}

// Checkpoint is a saved adapter's metadata (the files live in the checkpoint directory).
type Checkpoint struct {
	Path, Owner, ModelID string
	Created              time.Time
	ExpiresAt            *time.Time
	Public               bool
	Data                 []byte // JSON: the gateway's metadata
}

// APIKey is an issued API key. The key itself is never stored, only its SHA-256.
type APIKey struct {
	ID      string // the key's public part; the tenant derives from it
	Name    string // the operator's label
	Hash    []byte // SHA-256 of the whole key
	Admin   bool   // may use the fleet and key-management endpoints
	Created time.Time
	Revoked *time.Time // nil while the key is valid
}

// Event kinds.
const (
	EventAudit = "audit" // who did what to which run, checkpoint or key
	EventUsage = "usage" // what a tenant used: tokens, checkpoints, compute time
)

// EventQuery selects a page of events: of one kind, of one tenant ("" for all), whose name
// starts with NamePrefix ("" for any), with At in [From, To); Skip leaves out that many of the
// rows at From's millisecond (those a previous page returned), and Limit bounds the page.
type EventQuery struct {
	Kind, Tenant, NamePrefix string
	From, To                 time.Time
	Skip, Limit              int
}

// Event is one audit-log entry or usage record.
type Event struct {
	Tenant     string
	At         time.Time // audit: when; usage: when the work started
	Kind       string    // EventAudit or EventUsage
	Name       string    // audit: "checkpoint.save", …; usage: "training", "sampling_prefill", …
	ModelID    string
	TinkerPath string
	SessionID  string
	BaseModel  string
	Detail     string  // audit: free text (the purpose); usage: the op kind
	Amount     float64 // usage: tokens or checkpoints
	Seconds    float64 // usage: engine time
}

// UsageBucket is the sum of one tenant's usage of one name, session and base model in one hour.
type UsageBucket struct {
	Hour                               time.Time
	Tenant, Name, SessionID, BaseModel string
	Amount, Seconds                    float64
}

// StepMetric is one optimizer step of a training run: what optim_step reported and the loss of
// the forward_backwards since the step before.
type StepMetric struct {
	RunID string
	Step  int64
	At    time.Time
	Data  []byte // JSON: the gateway's record of the step
}

// Future states.
const (
	FuturePending  = "pending"
	FutureComplete = "complete"
	FutureFailed   = "failed"
)

// Future is an asynchronous request and, once terminal, its result.
type Future struct {
	ID, Tenant, Kind string
	OpKey            string // "model#seq" for ordered ops, to answer retries with the original id
	Owner            string // the gateway whose process runs it
	State            string
	Result           []byte // JSON result, or the error message when failed
	Category         string // "user" or "server" when failed
	Created          time.Time
	// Run and Request, when set, make the op one the run's next lease holder can run if this
	// gateway dies (see RunLeases): the run it is of, and the request as the gateway received it.
	Run     string
	Request []byte
}

// Store is the durable state. Implementations are safe for concurrent use.
type Store interface {
	PutSession(ctx context.Context, s Session) error
	// TouchSession moves a session's heartbeat forward (never back), leaving the rest of its
	// row: a heartbeat changes nothing else, and the row may be large. No row: nothing to do.
	TouchSession(ctx context.Context, id string, heartbeat time.Time) error
	Sessions(ctx context.Context) ([]Session, error)
	// DeleteSession forgets a session (closed long ago: see the gateway's leftovers sweep).
	DeleteSession(ctx context.Context, id string) error

	PutRun(ctx context.Context, r Run) error
	Runs(ctx context.Context) ([]Run, error)
	// DeleteRun forgets a training run.
	DeleteRun(ctx context.Context, id string) error

	// AddStepMetric stores (or replaces) one step of a run and drops the run's steps more than
	// keep steps older than it, so that a run holds at most keep of them.
	AddStepMetric(ctx context.Context, m StepMetric, keep int) error
	// StepMetrics lists a run's steps after afterStep, oldest first, at most limit of them.
	StepMetrics(ctx context.Context, runID string, afterStep int64, limit int) ([]StepMetric, error)
	// DeleteStepMetrics forgets every step of a run.
	DeleteStepMetrics(ctx context.Context, runID string) error

	PutSampler(ctx context.Context, s Sampler) error
	DeleteSampler(ctx context.Context, id string) error
	Samplers(ctx context.Context) ([]Sampler, error)

	PutCheckpoint(ctx context.Context, c Checkpoint) error
	DeleteCheckpoint(ctx context.Context, path string) error
	Checkpoints(ctx context.Context) ([]Checkpoint, error)

	// CreateFuture inserts a pending future. If OpKey is set and a future with that key exists,
	// it returns that one and false.
	CreateFuture(ctx context.Context, f Future) (Future, bool, error)
	// FinishFuture moves a pending future to a terminal state; a terminal future never changes,
	// and finishing it again reports false.
	FinishFuture(ctx context.Context, id, state string, result []byte, category string) (bool, error)
	GetFuture(ctx context.Context, id string) (Future, error)
	// FailOrphaned ends with a server error every pending future whose gateway is not self and has
	// not heartbeated within liveWithin (0: every other gateway is dead, as after a crash of the
	// only gateway); it returns how many. Futures that carry their request are left for the
	// run's next lease holder (RunLeases.OrphanedRuns).
	FailOrphaned(ctx context.Context, self string, liveWithin time.Duration, msg string) (int, error)
	// SweepFutures deletes terminal futures created before the cutoff.
	SweepFutures(ctx context.Context, before time.Time) (int, error)

	// TouchTenant records a tenant (the hash of an API key; raw keys are never stored).
	TouchTenant(ctx context.Context, id string) error
	Tenants(ctx context.Context) ([]string, error)

	// CreateKey stores a new API key; an ID already taken is ErrExists.
	CreateKey(ctx context.Context, k APIKey) error
	// GetKey finds a key by ID (ErrNotFound if none), revoked or not.
	GetKey(ctx context.Context, id string) (APIKey, error)
	// Keys lists every key, revoked ones too, oldest first.
	Keys(ctx context.Context) ([]APIKey, error)
	// RevokeKey marks a key revoked (ErrNotFound if none); revoking again keeps the first time.
	RevokeKey(ctx context.Context, id string, at time.Time) error

	// AddEvent appends an audit-log entry or a usage record.
	AddEvent(ctx context.Context, e Event) error
	// Events lists the events of a kind with At in [from, to), of one tenant ("" for all), oldest
	// first, at most limit of them.
	Events(ctx context.Context, kind, tenant string, from, to time.Time, limit int) ([]Event, error)
	// UsageBuckets sums the usage records of one tenant ("" for all) in [from, to) by hour,
	// tenant, name, session and base model, oldest hour first, at most limit rows.
	UsageBuckets(ctx context.Context, tenant string, from, to time.Time, limit int) ([]UsageBucket, error)
	// EventPage lists one page of events (see EventQuery), oldest first.
	EventPage(ctx context.Context, q EventQuery) ([]Event, error)
	// SweepEvents deletes events older than the cutoff.
	SweepEvents(ctx context.Context, before time.Time) (int, error)

	// PutPlacement records which replica holds an adapter; DeletePlacement forgets it.
	PutPlacement(ctx context.Context, adapter, replica string) error
	DeletePlacement(ctx context.Context, adapter string) error
	Placements(ctx context.Context) (map[string]string, error)

	// GatewayHeartbeat records that a gateway is alive.
	GatewayHeartbeat(ctx context.Context, id string) error
	// TryLease takes or renews a named lease for ttl; it reports whether holder has it. Periodic
	// sweeps run under a lease so that one gateway at a time does them.
	TryLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error)

	// ClusterSecret returns the secret called name, storing candidate first if there is none:
	// every gateway on one store gets the same one, whichever asked first.
	ClusterSecret(ctx context.Context, name string, candidate []byte) ([]byte, error)

	RunLeases

	Close() error
}

// RunLeases are the per-run ownership leases of several gateways on one store (see leases.go).
type RunLeases interface {
	// AcquireRunLease takes or renews a run's lease for holder (serving at addr) and returns the
	// lease as it is afterwards (held by holder, or live by another gateway). Taking raises the
	// epoch; renewing a live lease keeps it.
	AcquireRunLease(ctx context.Context, run, holder, addr string, ttl time.Duration) (RunLease, error)
	// RenewRunLeases extends every live lease of holder and returns them; a lease not returned
	// is no longer holder's.
	RenewRunLeases(ctx context.Context, holder string, ttl time.Duration) ([]RunLease, error)
	// ReleaseRunLease ends holder's lease of a run at epoch now, keeping its epoch.
	ReleaseRunLease(ctx context.Context, run, holder string, epoch int64) error
	// RunLeaseOf reads a run's lease (ErrNotFound: never held).
	RunLeaseOf(ctx context.Context, run string) (RunLease, error)
	// FinishFutureFenced is FinishFuture only while fence still holds its run (ErrFenced if not).
	FinishFutureFenced(ctx context.Context, id, state string, result []byte, category string, fence Fence) (bool, error)
	// PutRunFenced is PutRun only while fence still holds its run (ErrFenced if not).
	PutRunFenced(ctx context.Context, r Run, fence Fence) error
	// PendingOps lists a run's pending futures that carry their request.
	PendingOps(ctx context.Context, run string) ([]Future, error)
	// OrphanedRuns lists runs with pending futures carrying their request and no live lease.
	OrphanedRuns(ctx context.Context, limit int) ([]string, error)
	// AdoptFuture makes owner the gateway of a pending future; false if it is terminal.
	AdoptFuture(ctx context.Context, id, owner string) (bool, error)
	// GetRun reads one run (ErrNotFound if none).
	GetRun(ctx context.Context, id string) (Run, error)
	// GetSampler reads one sampler (ErrNotFound if none).
	GetSampler(ctx context.Context, id string) (Sampler, error)
	// GetCheckpoint reads one checkpoint (ErrNotFound if none).
	GetCheckpoint(ctx context.Context, path string) (Checkpoint, error)
	// GetSession reads one session (ErrNotFound if none).
	GetSession(ctx context.Context, id string) (Session, error)
	// SessionsOf lists one tenant's sessions, oldest first.
	SessionsOf(ctx context.Context, tenant string) ([]Session, error)
	// RunsVisibleTo lists a tenant's runs and the runs with a published checkpoint, oldest first.
	RunsVisibleTo(ctx context.Context, tenant string) ([]Run, error)
	// CheckpointsVisibleTo lists a tenant's checkpoints and the published ones, oldest first.
	CheckpointsVisibleTo(ctx context.Context, tenant string) ([]Checkpoint, error)
	// SessionMembers lists a session's runs (oldest first) and samplers from their own rows,
	// whichever gateway wrote them.
	SessionMembers(ctx context.Context, id string) (runs, samplers []string, err error)
}

// FutureListener is a Store that reports futures finished by other gateways. listening is
// called each time notices start reaching fn (after every connection), so that the caller can
// re-read what may have finished while none did.
type FutureListener interface {
	ListenFutures(ctx context.Context, fn func(id string), listening func())
}

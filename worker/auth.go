package worker

// Authentication between a gateway and its workers without the cluster token on the wire.
//
// The token is a shared secret; a peer proves it holds the token by a MAC over fresh nonces,
// never by sending it. Each direction has one handshake and then per-request MACs:
//
//   - gateway → worker (every worker call, discovered or registered): the gateway posts
//     /worker/v1/hello {nonce: gN, id: gateway id}, nothing derived from the token. The worker
//     answers {nonce: wN, id: its instance id, proof: HMAC(token, "worker proof"‖gN‖wN‖gwID‖instance)}.
//     The gateway checks the proof before anything else goes there; both derive the session key
//     K = HMAC(token, "call key"‖gN‖wN‖gwID‖instance), and every call carries the session (wN),
//     a sequence number, the body's SHA-256 and HMAC(K, "request"‖method‖path‖seq‖body hash).
//     The first call the worker accepts proves that the gateway holds the token too.
//   - worker → gateway (registration and heartbeats): the same with the roles swapped:
//     /api/v1/skein/workers/hello {nonce: wN, id: instance} answered by {nonce: gN, id: gateway
//     id, proof: HMAC(token, "gateway proof"‖wN‖gN‖instance‖gwID)}; key "register key".
//
// Every field is length-prefixed and every use has its own label, so no proof or MAC of one
// kind is one of another kind (a worker cannot be used as an oracle for a gateway's proof). A
// verifier accepts a sequence number once per session (a window of replayWindow below the
// highest seen, for calls that overtake each other), so a captured request replayed anywhere is
// refused: to another peer (the key is bound to both nonces), to the same one (seen), to a
// restarted one (unknown session). Answers are not MACed: the threat here is a stranger at a
// peer's address, which the handshake excludes; an on-path attacker needs TLS or a private
// network, as before.

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Headers of an authenticated request.
const (
	SessionHeader  = "X-Skein-Session"
	SeqHeader      = "X-Skein-Seq"
	BodyHashHeader = "X-Skein-Body-Sha256"
	MACHeader      = "X-Skein-Mac"
)

const (
	labelWorkerProof  = "skein/1 worker proof"
	labelGatewayProof = "skein/1 gateway proof"
	labelCallKey      = "skein/1 call key"
	labelRegisterKey  = "skein/1 register key"
	labelRequest      = "skein/1 request"
)

// Hello opens a handshake: the caller's fresh nonce and its identity (a gateway's id, or a
// worker's instance id). It carries nothing derived from the token.
type Hello struct {
	Nonce string `json:"nonce"`
	ID    string `json:"id"`
}

// HelloReply answers a Hello: the answerer's nonce and identity and its proof of the token.
type HelloReply struct {
	Nonce string `json:"nonce"`
	ID    string `json:"id"`
	Proof string `json:"proof"`
}

// maxHelloBytes bounds a hello or its answer.
const maxHelloBytes = 4 << 10

// ErrUnproven: the peer did not prove it holds the cluster token (a stranger at its address).
var ErrUnproven = errors.New("the peer did not prove it holds the cluster token")

func mac(key []byte, label string, fields ...string) []byte {
	h := hmac.New(sha256.New, key)
	writeField(h, label)
	for _, f := range fields {
		writeField(h, f)
	}
	return h.Sum(nil)
}

func writeField(h hash.Hash, s string) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	io.WriteString(h, s)
}

// NewNonce is 32 random bytes in hex.
func NewNonce() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func validNonce(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// validPeerID: a gateway or instance id is 1 to 128 printable ASCII bytes.
func validPeerID(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func (h Hello) valid() bool { return validNonce(h.Nonce) && validPeerID(h.ID) }
func (h HelloReply) valid() bool {
	return validNonce(h.Nonce) && validPeerID(h.ID) && len(h.Proof) == 64
}

// signer signs the requests of one session.
type signer struct {
	sid string
	key []byte
	seq atomic.Uint64
}

// sign sets the authentication headers of a request to path with body.
func (s *signer) sign(h http.Header, method, path string, body []byte) {
	sum := sha256.Sum256(body)
	bh := hex.EncodeToString(sum[:])
	seq := strconv.FormatUint(s.seq.Add(1), 10)
	h.Set(SessionHeader, s.sid)
	h.Set(SeqHeader, seq)
	h.Set(BodyHashHeader, bh)
	h.Set(MACHeader, hex.EncodeToString(mac(s.key, labelRequest, method, path, seq, bh)))
}

// Session bounds (defaults of NewSessions callers; SECURITY.md states them).
const (
	// replayWindow: sequence numbers more than this far below a session's highest are refused.
	replayWindow = 4096
	// sessionIdle: a session unused this long is forgotten (its peer shakes hands again).
	sessionIdle = 10 * time.Minute
	// maxPendingSessions: answered hellos whose peer has not yet sent a valid request; past
	// it the oldest is forgotten (anyone may say hello; only token holders prove a session).
	maxPendingSessions = 256
)

// Sessions are a verifier's handshakes: pending ones (a hello answered) and proven ones (a
// request under the session's key accepted). Both are bounded; strangers can only make pending ones.
type Sessions struct {
	mu        sync.Mutex
	m         map[string]*session
	maxProven int
	now       func() time.Time
}

type session struct {
	key     []byte
	peer    string
	proven  bool
	created time.Time
	last    time.Time
	high    uint64
	seen    map[uint64]struct{}
}

// NewSessions keeps at most maxProven proven sessions (the least recently used is forgotten
// past it) and maxPendingSessions pending ones.
func NewSessions(maxProven int) *Sessions {
	return &Sessions{m: map[string]*session{}, maxProven: maxProven, now: time.Now}
}

// add records a session whose hello was just answered.
func (ss *Sessions) add(sid string, key []byte, peer string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	now := ss.now()
	ss.expireLocked(now)
	ss.m[sid] = &session{key: key, peer: peer, created: now, last: now, seen: map[uint64]struct{}{}}
	ss.boundLocked(false, maxPendingSessions)
}

func (ss *Sessions) expireLocked(now time.Time) {
	for sid, s := range ss.m {
		if now.Sub(s.last) > sessionIdle {
			delete(ss.m, sid)
		}
	}
}

// boundLocked forgets the least recently used sessions of one kind past limit.
func (ss *Sessions) boundLocked(proven bool, limit int) {
	for {
		n, oldest, oldestAt := 0, "", time.Time{}
		for sid, s := range ss.m {
			if s.proven != proven {
				continue
			}
			n++
			if oldest == "" || s.last.Before(oldestAt) {
				oldest, oldestAt = sid, s.last
			}
		}
		if n <= limit {
			return
		}
		delete(ss.m, oldest)
	}
}

// ErrBadSession: a request's authentication was refused (no such session, a replayed or
// altered request); the caller may shake hands again.
var ErrBadSession = errors.New("bad worker token: unauthenticated worker request")

// Check verifies a request's authentication headers, before its body is read: a known session,
// a MAC under its key, a sequence number not seen before. It returns the session's peer and the
// body's expected SHA-256 (check it with VerifiedBody). The sequence number is spent.
func (ss *Sessions) Check(r *http.Request) (peer, bodyHash string, err error) {
	sid, seqs, bh, m := r.Header.Get(SessionHeader), r.Header.Get(SeqHeader), r.Header.Get(BodyHashHeader), r.Header.Get(MACHeader)
	seq, perr := strconv.ParseUint(seqs, 10, 64)
	got, herr := hex.DecodeString(m)
	if sid == "" || perr != nil || seq == 0 || len(bh) != 64 || herr != nil {
		return "", "", fmt.Errorf("%w: missing or malformed authentication", ErrBadSession)
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[sid]
	now := ss.now()
	if s == nil || now.Sub(s.last) > sessionIdle {
		delete(ss.m, sid)
		return "", "", fmt.Errorf("%w: unknown session", ErrBadSession)
	}
	if !hmac.Equal(got, mac(s.key, labelRequest, r.Method, r.URL.Path, seqs, bh)) {
		return "", "", fmt.Errorf("%w: bad signature", ErrBadSession)
	}
	if _, dup := s.seen[seq]; dup || seq+replayWindow <= s.high {
		return "", "", fmt.Errorf("%w: replayed request", ErrBadSession)
	}
	s.seen[seq] = struct{}{}
	if seq > s.high {
		s.high = seq
		if len(s.seen) > 2*replayWindow {
			for n := range s.seen {
				if n+replayWindow <= s.high {
					delete(s.seen, n)
				}
			}
		}
	}
	s.last = now
	if !s.proven {
		s.proven = true
		ss.boundLocked(true, ss.maxProven)
	}
	return s.peer, bh, nil
}

// VerifiedBody reads a request body while hashing it: Verify (after the body was consumed as
// far as the caller needs) reads the rest and compares the hash with the one the MAC covered.
type VerifiedBody struct {
	r    io.Reader
	h    hash.Hash
	want string
}

// NewVerifiedBody wraps body, whose SHA-256 must be want (hex).
func NewVerifiedBody(body io.Reader, want string) *VerifiedBody {
	h := sha256.New()
	return &VerifiedBody{r: io.TeeReader(body, h), h: h, want: want}
}

func (v *VerifiedBody) Read(p []byte) (int, error) { return v.r.Read(p) }

// Verify drains the body and checks its hash.
func (v *VerifiedBody) Verify() error {
	if _, err := io.Copy(io.Discard, v.r); err != nil {
		return err
	}
	if hex.EncodeToString(v.h.Sum(nil)) != v.want {
		return fmt.Errorf("%w: the body is not the one signed", ErrBadSession)
	}
	return nil
}

// AnswerGatewayHello is the gateway's side of a worker's hello (worker → gateway): it records a
// pending session in ss and returns the answer proving the gateway holds token.
func AnswerGatewayHello(ss *Sessions, token, gatewayID string, h Hello) (HelloReply, error) {
	if token == "" || !h.valid() {
		return HelloReply{}, errors.New("malformed hello: a 64-hex-digit nonce and an id of 1 to 128 printable bytes")
	}
	gN := NewNonce()
	ss.add(gN, mac([]byte(token), labelRegisterKey, h.Nonce, gN, h.ID, gatewayID), h.ID)
	return HelloReply{Nonce: gN, ID: gatewayID, Proof: hex.EncodeToString(mac([]byte(token), labelGatewayProof, h.Nonce, gN, h.ID, gatewayID))}, nil
}

// answerWorkerHello is a worker's side of a gateway's hello (gateway → worker).
func answerWorkerHello(ss *Sessions, token, instance string, h Hello) (HelloReply, error) {
	if token == "" || !h.valid() {
		return HelloReply{}, errors.New("malformed hello: a 64-hex-digit nonce and an id of 1 to 128 printable bytes")
	}
	wN := NewNonce()
	ss.add(wN, mac([]byte(token), labelCallKey, h.Nonce, wN, h.ID, instance), h.ID)
	return HelloReply{Nonce: wN, ID: instance, Proof: hex.EncodeToString(mac([]byte(token), labelWorkerProof, h.Nonce, wN, h.ID, instance))}, nil
}

// checkProof verifies a hello's answer r, whose proof and key cover fields, and returns the
// session's signer.
func checkProof(token, proofLabel, keyLabel string, r HelloReply, fields ...string) (*signer, error) {
	got, err := hex.DecodeString(r.Proof)
	if err != nil || !hmac.Equal(got, mac([]byte(token), proofLabel, fields...)) {
		return nil, ErrUnproven
	}
	return &signer{sid: r.Nonce, key: mac([]byte(token), keyLabel, fields...)}, nil
}

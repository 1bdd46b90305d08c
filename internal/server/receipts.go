package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/confidential-mcp/cmcp/internal/witness"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/excerpt"
)

// receipter writes the receipt of every session that ends (audit.receipts)
// and serves them on request (the admin listener). A session's end only
// queues its id: one goroutine signs a checkpoint and reads the epoch once
// for every session queued meanwhile, so a burst of ends costs one reading.
type receipter struct {
	w      *auditlog.Writer
	wit    *witness.Gateway // nil: no witnesses
	dir    string           // audit directory
	out    string           // where receipts are written ("": on request only)
	logger *slog.Logger

	mu      sync.Mutex
	queue   []string
	kick    chan struct{}
	done    chan struct{}
	stopped bool
}

// maxQueuedReceipts bounds the sessions waiting for their receipt.
const maxQueuedReceipts = 4096

func newReceipter(w *auditlog.Writer, wit *witness.Gateway, auditDir, out string, logger *slog.Logger) *receipter {
	r := &receipter{w: w, wit: wit, dir: auditDir, out: out, logger: logger, kick: make(chan struct{}, 1), done: make(chan struct{})}
	if out != "" {
		go r.run()
	} else {
		close(r.done)
	}
	return r
}

// ended queues a session's receipt (gateway.Options.OnSessionEnd).
func (r *receipter) ended(id string) {
	r.mu.Lock()
	if r.stopped || len(r.queue) >= maxQueuedReceipts {
		r.mu.Unlock()
		r.logger.Warn("no receipt for this session: the receipt queue is full or closed (it can be made later: cmcp verify-chain DIR --make-receipt ID)", "session", id)
		return
	}
	r.queue = append(r.queue, id)
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// stop writes the receipts queued so far and stops (before the log closes).
func (r *receipter) stop() {
	r.mu.Lock()
	already := r.stopped
	r.stopped = true
	r.mu.Unlock()
	if !already && r.out != "" {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
	<-r.done
}

func (r *receipter) run() {
	defer close(r.done)
	for range r.kick {
		r.mu.Lock()
		ids, stopped := r.queue, r.stopped
		r.queue = nil
		r.mu.Unlock()
		if len(ids) > 0 {
			if err := r.write(ids); err != nil {
				r.logger.Error("session receipts not written (they can be made later: cmcp verify-chain DIR --make-receipt ID)", "sessions", len(ids), "err", err)
			}
		}
		if stopped {
			return
		}
	}
}

// make returns the receipts of sessions of the current epoch, after a
// checkpoint that covers their records.
func (r *receipter) make(ids []string) (map[string]*excerpt.SessionReceipt, error) {
	if err := r.w.Checkpoint(); err != nil {
		return nil, fmt.Errorf("sign a checkpoint for the receipt: %w", err)
	}
	// With witnesses, the receipt carries their cosignatures on that
	// checkpoint when they answer in time; otherwise it rests on the
	// epoch's key (and says so when verified with --witness).
	if !r.wit.WaitCosigned(5 * time.Second) {
		r.logger.Warn("a receipt is made before every witness cosigned its checkpoint")
	}
	epoch, _ := r.w.Epoch()
	return excerpt.MakeReceipts(r.dir, epoch, ids, auditlog.VerifyOptions{Keys: []string{r.w.VerifierKey()}})
}

// plainID is 1-128 of these characters; the length is checked apart
// (a counted repetition compiles to one instruction per count).
var plainID = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

func (r *receipter) write(ids []string) error {
	rs, err := r.make(ids)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(r.out, 0o700); err != nil {
		return err
	}
	epoch, _ := r.w.Epoch()
	for id, rc := range rs {
		name := id
		if len(id) > 128 || !plainID.MatchString(id) || name[0] == '.' {
			sum := sha256.Sum256([]byte(id))
			name = "sha256-" + hex.EncodeToString(sum[:])
		}
		b, err := rc.Encode()
		if err != nil {
			return err
		}
		p := filepath.Join(r.out, fmt.Sprintf("%06d-%s.receipt.json", epoch, name))
		if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
			return err
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			return err
		}
	}
	return nil
}

// serve is the admin listener's GET /admin/receipt: nil when the current
// epoch holds no record of the session.
func (r *receipter) serve(_ context.Context, id string) ([]byte, error) {
	rs, err := r.make([]string{id})
	if err != nil {
		return nil, err
	}
	rc := rs[id]
	if rc == nil {
		return nil, nil
	}
	return rc.Encode()
}

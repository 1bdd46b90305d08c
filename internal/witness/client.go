// Package witness submits the gateway's log checkpoints to witnesses with
// the C2SP tlog-witness protocol (POST <url>/add-checkpoint), checks their
// cosignatures (c2sp.org/tlog-cosignature, cosignature/v1) and keeps them
// in the audit log's witness.jsonl (pkg/auditlog FORMAT.md section 11).
//
// Submission never blocks the writer: Submit only records the newest log
// checkpoint and its new leaves; one goroutine per witness sends the newest
// checkpoint it has not had cosigned, with a consistency proof from the
// size that witness last cosigned, and retries a witness that is down with
// exponential backoff. Status reports each witness for /readyz and metrics.
package witness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
)

// Witness names one witness.
type Witness struct {
	Name string // for status and logs (the key's name by default)
	URL  string // submission prefix: the client POSTs to URL + "/add-checkpoint"
	Key  string // cosignature verifier key: <name>+<hash>+<base64(0x04||key)>
}

// Config configures a Client.
type Config struct {
	Witnesses []Witness
	// LogKey is the log key's note verifier key (Writer.LogVerifierKey).
	LogKey string
	// AuditDir is the audit directory: proofs from sizes the client no
	// longer holds in memory read it.
	AuditDir string
	// HTTP is the client used for submissions (default: 10 s timeout).
	HTTP *http.Client
	// Logger gets state changes (default slog.Default()).
	Logger *slog.Logger
	// Refresh is how often the newest checkpoint is submitted again while
	// no new one comes, so that its cosignatures stay fresh (default 1 min).
	Refresh time.Duration
	// MinBackoff and MaxBackoff bound the retry delay of a witness that
	// failed (defaults 500 ms and 2 min).
	MinBackoff, MaxBackoff time.Duration
	// MaxLeaves bounds the log entries kept in memory for proofs (default
	// 1<<20); a witness further behind gets its proof from the disk.
	MaxLeaves int
}

// State of a witness.
const (
	StateStarting = "starting" // nothing cosigned yet in this run
	StateOK       = "ok"       // the newest checkpoint it was sent is cosigned
	StateDown     = "down"     // unreachable or failing (5xx, timeouts): retried with backoff
	StateRefused  = "refused"  // 403/404/400: it does not know or trust this log (configuration)
	StateConflict = "conflict" // it holds a tree this log does not extend: fork or rollback
)

// Status is one witness's state.
type Status struct {
	Name         string    `json:"name"`
	URL          string    `json:"url"`
	State        string    `json:"state"`
	Size         int64     `json:"cosigned_size"` // the newest size it cosigned in this run
	Cosigned     time.Time `json:"cosigned_at"`   // when
	Pending      int64     `json:"pending_size"`  // the newest size waiting for it
	Error        string    `json:"error,omitempty"`
	Failures     int       `json:"consecutive_failures"`
	Submissions  uint64    `json:"submissions"`
	Cosignatures uint64    `json:"cosignatures"`
	Errors       uint64    `json:"errors"`
}

// Client submits log checkpoints to witnesses.
type Client struct {
	cfg    Config
	logV   note.Verifier
	log    *slog.Logger
	http   *http.Client
	ws     []*wstate
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex // guards latest, pending, statuses (in wstate)
	latest  *auditlog.LogCheckpoint
	pending []tlog.Hash // leaves not yet in tree

	treeMu sync.Mutex
	tree   *auditlog.LogTree

	fileMu   sync.Mutex // one append to witness.jsonl at a time
	epochDir string
}

type wstate struct {
	w      Witness
	v      note.Verifier
	kick   chan struct{}
	st     Status
	old    int64 // the size we believe the witness holds (0: unknown)
	sentAt time.Time
}

// New checks the configuration and starts one goroutine per witness.
func New(cfg Config) (*Client, error) {
	if len(cfg.Witnesses) == 0 {
		return nil, errors.New("witness: no witnesses configured")
	}
	lv, err := note.NewVerifier(cfg.LogKey)
	if err != nil {
		return nil, fmt.Errorf("witness: log key: %w", err)
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = time.Minute
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 500 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(2*time.Minute, cfg.MinBackoff)
	}
	if cfg.MaxLeaves <= 0 {
		cfg.MaxLeaves = 1 << 20
	}
	c := &Client{cfg: cfg, logV: lv, log: cfg.Logger, http: cfg.HTTP}
	for _, w := range cfg.Witnesses {
		v, err := c2sp.NewCosignatureVerifier(w.Key)
		if err != nil {
			return nil, fmt.Errorf("witness %s: %w", w.Name, err)
		}
		if w.Name == "" {
			w.Name = v.Name()
		}
		if !strings.HasPrefix(w.URL, "http://") && !strings.HasPrefix(w.URL, "https://") {
			return nil, fmt.Errorf("witness %s: url %q: want http:// or https://", w.Name, w.URL)
		}
		c.ws = append(c.ws, &wstate{w: w, v: v, kick: make(chan struct{}, 1), st: Status{Name: w.Name, URL: w.URL, State: StateStarting}})
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

// Attach starts the submissions once the writer is open: epochDir is the
// epoch's directory (witness.jsonl goes there), base and frontier the log
// tree before it (Writer.LogBase). Checkpoints Submit got before Attach
// (the writer signs one in Open) are sent then.
func (c *Client) Attach(epochDir string, base int64, frontier []tlog.Hash) error {
	tree, err := auditlog.NewLogTree(c.cfg.AuditDir, base, frontier)
	if err != nil {
		return fmt.Errorf("witness: log tree: %w", err)
	}
	c.treeMu.Lock()
	if c.tree != nil {
		c.treeMu.Unlock()
		return errors.New("witness: Attach called twice")
	}
	c.tree, c.epochDir = tree, epochDir
	c.treeMu.Unlock()
	for _, ws := range c.ws {
		c.wg.Add(1)
		go c.run(ws)
		select {
		case ws.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// Submit hands the client a new log checkpoint (from
// auditlog.LogIdentity.OnCheckpoint). It never blocks on the network: it
// keeps the newest checkpoint and wakes the witnesses' goroutines.
func (c *Client) Submit(cp auditlog.LogCheckpoint) {
	c.mu.Lock()
	c.pending = append(c.pending, cp.Leaves...)
	cp.Leaves = nil
	c.latest = &cp
	for _, ws := range c.ws {
		ws.st.Pending = cp.Size
	}
	c.mu.Unlock()
	for _, ws := range c.ws {
		select {
		case ws.kick <- struct{}{}:
		default:
		}
	}
}

// Status returns every witness's state.
func (c *Client) Status() []Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Status, len(c.ws))
	for i, ws := range c.ws {
		out[i] = ws.st
	}
	return out
}

// Close waits (until ctx ends) for every witness that is not down or in
// conflict to cosign the newest checkpoint, then stops.
func (c *Client) Close(ctx context.Context) error {
	defer func() {
		c.cancel()
		c.wg.Wait()
	}()
	c.treeMu.Lock()
	attached := c.tree != nil
	c.treeMu.Unlock()
	if !attached {
		return nil
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		done := true
		c.mu.Lock()
		for _, ws := range c.ws {
			if c.latest != nil && ws.st.Size < c.latest.Size && (ws.st.State == StateOK || ws.st.State == StateStarting) {
				done = false
			}
		}
		c.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("witness: the newest checkpoint was not cosigned by every witness before the deadline: %w", ctx.Err())
		case <-t.C:
		}
	}
}

func (c *Client) run(ws *wstate) {
	defer c.wg.Done()
	var retry <-chan time.Time
	backoff := c.cfg.MinBackoff
	refresh := time.NewTimer(c.cfg.Refresh)
	defer refresh.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-ws.kick:
			if retry != nil {
				continue // a failing witness waits for its backoff
			}
		case <-retry:
			retry = nil
		case <-refresh.C:
		}
		refresh.Reset(c.cfg.Refresh)
		c.mu.Lock()
		cp := c.latest
		fresh := cp != nil && ws.st.Size == cp.Size && time.Since(ws.sentAt) < c.cfg.Refresh
		c.mu.Unlock()
		if cp == nil || fresh {
			continue
		}
		err := c.submit(ws, cp)
		c.mu.Lock()
		ws.st.Submissions++
		if err == nil {
			if ws.st.State != StateOK && ws.st.State != StateStarting {
				c.log.Info("witness cosigns again", "witness", ws.w.Name, "size", cp.Size)
			}
			ws.st.State, ws.st.Error, ws.st.Failures = StateOK, "", 0
			ws.st.Size, ws.st.Cosigned = cp.Size, time.Now().UTC()
			ws.st.Cosignatures++
			backoff = c.cfg.MinBackoff
		} else {
			var se *stateError
			state := StateDown
			if errors.As(err, &se) {
				state = se.state
			}
			if ws.st.State != state || ws.st.Error != err.Error() {
				lvl := slog.LevelWarn
				if state == StateConflict {
					lvl = slog.LevelError
				}
				c.log.Log(context.Background(), lvl, "witness submission failed", "witness", ws.w.Name, "state", state, "size", cp.Size, "err", err)
			}
			ws.st.State, ws.st.Error = state, err.Error()
			ws.st.Failures++
			ws.st.Errors++
			d := backoff/2 + rand.N(backoff/2+1)
			if state != StateDown {
				d = c.cfg.MaxBackoff
			}
			retry = time.After(d)
			backoff = min(2*backoff, c.cfg.MaxBackoff)
		}
		newer := c.latest != nil && c.latest.Size > cp.Size
		c.mu.Unlock()
		if err == nil {
			c.trim()
			if newer {
				select {
				case ws.kick <- struct{}{}:
				default:
				}
			}
		}
	}
}

type stateError struct {
	state string
	err   error
}

func (e *stateError) Error() string { return e.err.Error() }
func (e *stateError) Unwrap() error { return e.err }

func conflict(format string, a ...any) error {
	return &stateError{StateConflict, fmt.Errorf(format, a...)}
}
func refused(format string, a ...any) error {
	return &stateError{StateRefused, fmt.Errorf(format, a...)}
}

// proof returns the consistency proof from old to cp.Size.
func (c *Client) proof(old int64, cp *auditlog.LogCheckpoint) (tlog.TreeProof, error) {
	c.treeMu.Lock()
	defer c.treeMu.Unlock()
	c.mu.Lock()
	leaves := c.pending
	c.pending = nil
	c.mu.Unlock()
	c.tree.Append(leaves...)
	if old == 0 || old == cp.Size {
		return nil, nil
	}
	if old > cp.Size {
		return nil, conflict("the witness has cosigned %d log entries, more than this log's %d: the log was rolled back or cut, or another log with this origin and key was shown to it", old, cp.Size)
	}
	return c.tree.Prove(old, cp.Size)
}

// trim forgets the leaves every witness is past, within MaxLeaves.
func (c *Client) trim() {
	c.mu.Lock()
	low := int64(-1)
	for _, ws := range c.ws {
		if low < 0 || ws.st.Size < low {
			low = ws.st.Size
		}
	}
	c.mu.Unlock()
	c.treeMu.Lock()
	defer c.treeMu.Unlock()
	if over := c.tree.Size() - c.tree.Floor() - int64(c.cfg.MaxLeaves); over > 0 {
		low = max(low, c.tree.Floor()+over)
	}
	c.tree.Trim(low)
}

// submit sends cp to one witness, following one 409 to the size it holds.
func (c *Client) submit(ws *wstate, cp *auditlog.LogCheckpoint) error {
	for attempt := 0; ; attempt++ {
		proof, err := c.proof(ws.old, cp)
		if err != nil {
			return err
		}
		var body bytes.Buffer
		fmt.Fprintf(&body, "old %d\n", ws.old)
		for _, h := range proof {
			body.WriteString(h.String())
			body.WriteByte('\n')
		}
		body.WriteByte('\n')
		body.Write(cp.Note)
		req, err := http.NewRequestWithContext(c.ctx, http.MethodPost, strings.TrimRight(ws.w.URL, "/")+"/add-checkpoint", &body)
		if err != nil {
			return refused("witness url: %w", err)
		}
		resp, err := c.http.Do(req)
		if err != nil {
			return fmt.Errorf("witness %s unreachable: %w", ws.w.Name, err)
		}
		rb, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("witness %s: read the answer: %w", ws.w.Name, err)
		}
		msg := strings.TrimSpace(string(rb))
		switch resp.StatusCode {
		case http.StatusOK:
			c.mu.Lock()
			ws.sentAt = time.Now()
			c.mu.Unlock()
			return c.accept(ws, cp, rb)
		case http.StatusConflict:
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/x.tlog.size") {
				return conflict("witness %s answered 409 (%s) without its size: it holds another tree of this size (fork)", ws.w.Name, clip(msg))
			}
			n, perr := strconv.ParseInt(strings.TrimSpace(string(rb)), 10, 64)
			if perr != nil || n < 0 {
				return fmt.Errorf("witness %s: 409 with a size %q that is not a number", ws.w.Name, clip(msg))
			}
			if n == ws.old || attempt >= 2 {
				return conflict("witness %s keeps answering 409 (it holds size %d)", ws.w.Name, n)
			}
			ws.old = n
			continue
		case http.StatusUnprocessableEntity:
			ws.old = 0 // learn its size again next time
			return conflict("witness %s rejected the consistency proof (422: %s): it holds a tree this log does not extend (fork or rollback)", ws.w.Name, clip(msg))
		case http.StatusForbidden, http.StatusNotFound:
			return refused("witness %s does not know or trust this log (%d: %s): add the origin and the log key to it (litewitness: witnessctl add-log -origin %s, add-key -key %s)", ws.w.Name, resp.StatusCode, clip(msg), c.logV.Name(), c.cfg.LogKey)
		case http.StatusBadRequest:
			ws.old = 0
			return refused("witness %s refused the request (400: %s)", ws.w.Name, clip(msg))
		default:
			return fmt.Errorf("witness %s answered %d: %s", ws.w.Name, resp.StatusCode, clip(msg))
		}
	}
}

// accept checks the cosignature lines of a 200 answer and keeps them.
func (c *Client) accept(ws *wstate, cp *auditlog.LogCheckpoint, body []byte) error {
	if len(body) == 0 || body[len(body)-1] != '\n' {
		return conflict("witness %s answered 200 without cosignature lines", ws.w.Name)
	}
	signed := append(append([]byte(nil), cp.Note...), body...)
	n, err := note.Open(signed, note.VerifierList(c.logV, ws.v))
	if err != nil {
		return conflict("witness %s: its cosignature does not verify with its configured key: %v", ws.w.Name, err)
	}
	var line []byte
	for _, s := range n.Sigs {
		if s.Name == ws.v.Name() && s.Hash == ws.v.KeyHash() {
			line = fmt.Appendf(nil, "— %s %s\n", s.Name, s.Base64)
		}
	}
	if line == nil {
		return conflict("witness %s answered without a cosignature from its configured key", ws.w.Name)
	}
	ws.old = cp.Size
	kept := append(append([]byte(nil), cp.Note...), line...)
	c.fileMu.Lock()
	err = auditlog.AppendCosigned(c.epochDir, kept)
	c.fileMu.Unlock()
	if err != nil {
		return fmt.Errorf("keep the cosignature of %s: %w", ws.w.Name, err)
	}
	return nil
}

func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// WaitCosigned waits (until ctx ends) until every witness that is not down,
// refused or in conflict has cosigned the newest checkpoint submitted so
// far, e.g. before a receipt is made, so that it carries their
// cosignatures. It reports whether they all did.
func (c *Client) WaitCosigned(ctx context.Context) bool {
	c.mu.Lock()
	var want int64
	if c.latest != nil {
		want = c.latest.Size
	}
	c.mu.Unlock()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		done := true
		c.mu.Lock()
		for _, ws := range c.ws {
			if ws.st.Size < want && (ws.st.State == StateOK || ws.st.State == StateStarting) {
				done = false
			}
		}
		c.mu.Unlock()
		if done {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

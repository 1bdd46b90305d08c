package credential

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/confidential-mcp/cmcp/internal/contain"
)

// Exec is the exec source: a helper program, started without a shell,
// that reads {"identity","groups","upstream","audience"} as JSON on stdin
// and prints {"token","expires_at"} on stdout, as kubectl's exec credential
// plugins do. Its environment is Env and nothing else (PATH defaults to
// /usr/local/bin:/usr/bin:/bin): none of the gateway's own variables, none
// of its credentials. It runs in its own process group, which is killed
// when Timeout passes; stdout is read up to MaxExecOutput bytes and stderr
// only counted (a helper may print anything there, a credential too).
type Exec struct {
	// Command is the program (an absolute path); Args its arguments.
	Command string
	Args    []string
	// Env is the helper's whole environment.
	Env map[string]string
	// Timeout bounds one run (default 10 s).
	Timeout time.Duration
	// Dir is the working directory (default /).
	Dir string
}

// MaxExecOutput bounds what an exec helper may print on stdout.
const MaxExecOutput = 64 << 10

// DefaultExecTimeout bounds one run of an exec helper.
const DefaultExecTimeout = 10 * time.Second

// Kind is "exec".
func (e *Exec) Kind() string { return "exec" }

// execInput is what the helper reads on stdin.
type execInput struct {
	Identity string   `json:"identity"`
	Groups   []string `json:"groups"`
	Upstream string   `json:"upstream"`
	Audience string   `json:"audience"`
}

// execOutput is what the helper prints.
type execOutput struct {
	Token     *string `json:"token"`
	ExpiresAt *string `json:"expires_at"`
}

// Mint runs the helper once.
func (e *Exec) Mint(ctx context.Context, r Request) (Token, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("upstream %q: credential helper %s for %q: %s", r.Upstream, e.Command, r.Identity.Name, fmt.Sprintf(format, args...))
	}
	groups := r.Identity.Groups
	if groups == nil {
		groups = []string{}
	}
	in, err := json.Marshal(execInput{Identity: r.Identity.Name, Groups: groups, Upstream: r.Upstream, Audience: r.Audience})
	if err != nil {
		return Token{}, fail("encode its input: %v", err)
	}
	timeout := e.Timeout
	if timeout <= 0 {
		timeout = DefaultExecTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.Command, e.Args...)
	cmd.Env = execEnv(e.Env)
	cmd.Dir = e.Dir
	if cmd.Dir == "" {
		cmd.Dir = "/"
	}
	cmd.Stdin = bytes.NewReader(in)
	out := &capped{limit: MaxExecOutput}
	errs := &capped{limit: 0}
	cmd.Stdout, cmd.Stderr = out, errs
	cmd.SysProcAttr = helperAttr()
	cmd.Cancel = func() error {
		// The whole group: a helper's own children must not outlive it.
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = time.Second
	err = run(cmd)
	stderrNote := ""
	if errs.n > 0 {
		stderrNote = fmt.Sprintf(" (it wrote %d bytes to stderr, not shown: they may hold a credential; run it by hand to read them)", errs.n)
	}
	switch {
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return Token{}, fail("did not finish within %s and was killed%s", timeout, stderrNote)
	case ctx.Err() != nil:
		return Token{}, fail("stopped: %v", ctx.Err())
	case err != nil:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return Token{}, fail("exited with %s%s", ee.ProcessState, stderrNote)
		}
		return Token{}, fail("could not run: %v", err)
	case out.over:
		return Token{}, fail("printed more than %d bytes on stdout; it must print one JSON object {\"token\", \"expires_at\"}", MaxExecOutput)
	}
	return parseExecOutput(out.buf.Bytes(), time.Now(), func(msg string) error { return fail("%s", msg) })
}

// run runs a helper registered with the gateway's orphan reaper: the
// helper has a process group of its own, as an adopted orphan has, and
// unregistered its exit could be reaped as an orphan's before Wait takes
// it ("waitid: no child processes"; TestExecHelperIsNotTakenForAnOrphan).
func run(cmd *exec.Cmd) error {
	release := contain.Starting()
	if err := cmd.Start(); err != nil {
		release()
		return err
	}
	pid := cmd.Process.Pid
	contain.OwnLocked(pid)
	release()
	defer contain.Disown(pid)
	return cmd.Wait()
}

// parseExecOutput reads the helper's stdout. Its errors never quote it:
// it holds the credential.
func parseExecOutput(b []byte, now time.Time, fail func(string) error) (Token, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var o execOutput
	if err := dec.Decode(&o); err != nil {
		msg := "its output is not a JSON object {\"token\": \"...\", \"expires_at\": \"RFC 3339 time\"}"
		var ut *json.UnmarshalTypeError
		switch {
		case errors.As(err, &ut):
			msg += fmt.Sprintf(" (%s is not a %s)", ut.Field, ut.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			msg += " (" + strings.TrimPrefix(err.Error(), "json: ") + ")"
		}
		return Token{}, fail(msg)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Token{}, fail("its output has more after the JSON object; print exactly one")
	}
	if o.Token == nil || *o.Token == "" {
		return Token{}, fail("its output has no token (or an empty one)")
	}
	for _, c := range []byte(*o.Token) {
		if c <= ' ' || c >= 0x7f {
			return Token{}, fail("its token has a space, a control or a non-ASCII character, which an Authorization header cannot carry")
		}
	}
	t := Token{Value: NewSecret(*o.Token)}
	if o.ExpiresAt != nil {
		exp, err := time.Parse(time.RFC3339, *o.ExpiresAt)
		if err != nil {
			return Token{}, fail(fmt.Sprintf("expires_at %q is not an RFC 3339 time (e.g. 2026-01-02T15:04:05Z)", *o.ExpiresAt))
		}
		if !exp.After(now) {
			return Token{}, fail(fmt.Sprintf("expires_at %s is not in the future", *o.ExpiresAt))
		}
		t.Expiry = exp
	}
	return t, nil
}

// execEnv is the helper's environment: env, sorted, with a default PATH.
func execEnv(env map[string]string) []string {
	out := make([]string, 0, len(env)+1)
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	if _, ok := env["PATH"]; !ok {
		out = append(out, "PATH=/usr/local/bin:/usr/bin:/bin")
	}
	sort.Strings(out)
	return out
}

// capped keeps at most limit bytes and counts all of them.
type capped struct {
	buf   bytes.Buffer
	limit int
	n     int
	over  bool
}

func (c *capped) Write(p []byte) (int, error) {
	c.n += len(p)
	if room := c.limit - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(room, len(p))])
	}
	if c.n > c.limit && c.limit > 0 {
		c.over = true
	}
	return len(p), nil
}

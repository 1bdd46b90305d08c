// Package spawnaudit records a stdio upstream's life in the audit log:
// each spawn (started or refused, with its measurement, pins, argv digest
// and committed environment), each exit and its stderr byte counts. Hooks
// returns the upstream.Hooks that do it; the server sets them on every
// stdio upstream.
package spawnaudit

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"

	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Log is the audit log as the hooks write to it (gateway.AuditLog is one).
type Log interface {
	Append(ctx context.Context, rec record.Record) (auditlog.Receipt, error)
	Commit(payload []byte) record.Commitment
}

// Metrics counts spawn attempts (gateway.Metrics is one).
type Metrics interface {
	// Spawn counts one attempt to start an upstream child, by result.
	Spawn(upstream, result string)
}

// Hooks returns the hooks that record a stdio upstream's spawns
// (started or refused), exits and stderr byte counts in the audit log, and
// send its stderr lines to logger. No child is started while the log is
// known to be broken, and a child whose spawn record fails is stopped at
// once.
func Hooks(log Log, logger *slog.Logger, m Metrics) upstream.Hooks {
	return upstream.Hooks{
		Log: logger,
		Ready: func() error {
			if w, ok := log.(interface{ Err() error }); ok {
				return w.Err()
			}
			return nil
		},
		Spawn: func(ev upstream.SpawnEvent) error {
			rec := &record.Spawn{Upstream: ev.Upstream, Session: ev.Session, Shared: ev.SessionShare == "shared", Path: ev.Path,
				MeasureTarget: ev.MeasurePath, Digest: ev.Digest, Pin: ev.Pin, EvidenceClass: ev.Class, PID: int64(ev.PID), Outcome: "started", Reason: ev.Reason}
			if ev.MeasurePath != "" {
				// The record names the measure target; its digest and pin are
				// in the reason so that one record says everything.
				if ev.MeasureDig.IsZero() {
					rec.Reason = joinReason(rec.Reason, "measure target "+ev.MeasurePath+" not measured")
				} else {
					rec.Reason = joinReason(rec.Reason, "measure target digest "+ev.MeasureDig.String()+" pin "+ev.MeasurePin.String())
				}
			}
			if ev.Interpreter != "" {
				// Likewise a "#!" command's interpreter, measured and pinned
				// apart from the script.
				rec.Reason = joinReason(rec.Reason, "interpreter "+ev.Interpreter+" digest "+ev.InterpreterDig.String()+" pin "+pinText(ev.InterpreterPin))
			}
			if b, err := json.Marshal(ev.Args); err == nil {
				rec.ArgvDigest = digest.Bytes(b)
			}
			// The environment: its names in clear, its values (which may be
			// secrets) committed to as arguments are, the payload being
			// what /proc/<pid>/environ shows.
			rec.EnvNames = ev.EnvNames
			rec.Env = log.Commit(envPayload(ev.Env))
			if code := upstream.CodeEnvNames(ev.EnvNames); len(code) > 0 {
				rec.Reason = joinReason(rec.Reason, "the environment sets variables that load code the pin does not cover: "+strings.Join(code, ", "))
			}
			if m != nil {
				m.Spawn(ev.Upstream, spawnResult(ev))
			}
			if ev.Refused {
				rec.Outcome = "refused"
				if rec.EvidenceClass == "" {
					rec.EvidenceClass = "none"
				}
			}
			if logger != nil {
				if ev.Refused {
					logger.Warn("spawn refused", "upstream", ev.Upstream, "session", ev.Session, "reason", ev.Reason)
				} else if ev.Reason != "" && ev.Class == upstream.ClassSpawnUnmeasured {
					logger.Warn("spawned", "upstream", ev.Upstream, "session", ev.Session, "pid", ev.PID, "class", ev.Class, "digest", ev.Digest.String(), "reason", ev.Reason)
				} else {
					logger.Debug("spawned", "upstream", ev.Upstream, "session", ev.Session, "pid", ev.PID, "class", ev.Class, "digest", ev.Digest.String())
				}
			}
			_, err := log.Append(context.Background(), rec)
			return err
		},
		Stderr: func(ev upstream.ExitEvent) {
			srec := &record.Stderr{Upstream: ev.Upstream, Session: ev.Session, Bytes: ev.StderrBytes, Lines: ev.StderrLines, Dropped: ev.Dropped}
			if _, err := log.Append(context.Background(), srec); err != nil && logger != nil {
				logger.Error("record child stderr", "upstream", ev.Upstream, "err", err)
			}
		},
		Exit: func(ev upstream.ExitEvent) {
			if logger != nil && ev.Fault != "" {
				logger.Warn("upstream child ended", "upstream", ev.Upstream, "session", ev.Session, "pid", ev.PID, "fault", ev.Fault)
			}
			rec := &record.Spawn{Upstream: ev.Upstream, Session: ev.Session, Path: ev.Path, EvidenceClass: ev.Class, PID: int64(ev.PID), Outcome: "exited",
				ExitCode: int64(ev.ExitCode), Signal: ev.Signal, Reason: ev.Fault}
			if _, err := log.Append(context.Background(), rec); err != nil && logger != nil {
				logger.Error("record child exit", "upstream", ev.Upstream, "err", err)
			}
			srec := &record.Stderr{Upstream: ev.Upstream, Session: ev.Session, Bytes: ev.StderrBytes, Lines: ev.StderrLines, Dropped: ev.Dropped}
			if _, err := log.Append(context.Background(), srec); err != nil && logger != nil {
				logger.Error("record child stderr", "upstream", ev.Upstream, "err", err)
			}
		},
	}
}

// envPayload is the payload a spawn record's env commitment commits to:
// every NAME=VALUE of the child's environment followed by a NUL byte, in
// the order the child got them (what /proc/<pid>/environ shows).
func envPayload(env []string) []byte {
	var b []byte
	for _, kv := range env {
		b = append(append(b, kv...), 0)
	}
	return b
}

// pinText is d, or "none".
func pinText(d digest.Digest) string {
	if d.IsZero() {
		return "none"
	}
	return d.String()
}

func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func spawnResult(ev upstream.SpawnEvent) string {
	switch {
	case !ev.Refused:
		return "ok"
	case !ev.Pin.IsZero() && !ev.Digest.IsZero() && !ev.Digest.Equal(ev.Pin),
		!ev.InterpreterPin.IsZero() && !ev.InterpreterDig.IsZero() && !ev.InterpreterDig.Equal(ev.InterpreterPin):
		return "digest_mismatch"
	case ev.Pin.IsZero() && ev.Class == "":
		return "unpinned"
	default:
		return "refused"
	}
}

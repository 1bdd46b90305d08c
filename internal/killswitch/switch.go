package killswitch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// The kill switch outlives the process: while it is engaged its state is a
// small file in the audit directory (StateFile), written with
// fsync and rename before the kill_switch_on record, and removed (and the
// directory synced) only after the kill_switch_off record is durable (in
// interval durability, only after a checkpoint has synced it). A
// gateway that starts and finds the file starts engaged and records a
// kill_switch_on that says it was carried over; one that finds a file it
// cannot read starts engaged too (fail closed). Only the admin API clears
// it, recorded.

// Admin record actions of the kill switch.
const (
	ActionOn  = "kill_switch_on"
	ActionOff = "kill_switch_off"
)

// RestartActor is the actor of the kill_switch_on record a
// gateway writes at start when it carries the switch over from before the
// restart; the record's reason says who engaged it, when and why.
const RestartActor = "gateway-restart"

// Switch is a running gateway's kill switch: whether it is engaged, by
// whom, since when and why, its state file and its records.
type Switch struct {
	// File returns where the engaged switch's state is kept ("": in
	// memory only), read at each change.
	File   func() string
	Log    Log
	Logger *slog.Logger

	mu sync.RWMutex // see Set
	on atomic.Bool
	st Status // who engaged the switch, when, why (guarded by mu)
}

// Log is what the switch needs of the audit log.
type Log interface {
	Append(ctx context.Context, rec record.Record) (auditlog.Receipt, error)
	// Checkpoint makes every record appended so far durable.
	Checkpoint() error
}

// Engaged reports whether the switch is engaged.
func (k *Switch) Engaged() bool { return k.on.Load() }

// RLock holds the switch as it is: a record that must not follow
// kill_switch_on is appended between RLock, a check of Engaged and
// RUnlock.
func (k *Switch) RLock() { k.mu.RLock() }

// RUnlock releases RLock.
func (k *Switch) RUnlock() { k.mu.RUnlock() }

// Set engages or clears the kill switch. Engaging saves the state file
// (File, so that a restart keeps the switch engaged),
// then records kill_switch_on; if either fails the switch is engaged anyway
// (fail closed) and the error returned. Clearing records kill_switch_off
// first, makes it durable (with audit.durability: interval Append returns
// before the record is synced, so a checkpoint syncs it) and only then
// removes the state file: a power cut never leaves the file gone without
// the record. If any step fails the switch stays engaged (a failure after
// the record is followed by a new kill_switch_on saying so). No call or
// access record written after kill_switch_on in the log says "forwarded":
// the gateway checks the switch and appends its forwarded records under
// RLock, and the switch changes under its write lock. The records are
// written even if ctx ends meanwhile.
func (k *Switch) Set(ctx context.Context, on bool, actor, reason string) error {
	ctx = context.WithoutCancel(ctx)
	k.mu.Lock()
	defer k.mu.Unlock()
	if on {
		st := Status{Engaged: true, Since: time.Now().UTC(), Actor: actor, Reason: reason}
		var errs []error
		if path := k.File(); path != "" {
			if err := Write(path, st); err != nil {
				errs = append(errs, fmt.Errorf("its state could not be saved, so a restart would clear it (%s): %w", path, err))
			}
		}
		if _, err := k.Log.Append(ctx, &record.Admin{Action: ActionOn, Actor: actor, Reason: reason}); err != nil {
			errs = append(errs, fmt.Errorf("its audit record could not be written: %w", err))
		}
		k.on.Store(true)
		k.st = st
		return errors.Join(errs...)
	}
	rc, err := k.Log.Append(ctx, &record.Admin{Action: ActionOff, Actor: actor, Reason: reason})
	if err != nil {
		return fmt.Errorf("clearing it could not be recorded in the audit log: record %s: %w", ActionOff, err)
	}
	if !rc.Durable {
		if err := k.Log.Checkpoint(); err != nil {
			why := fmt.Sprintf("clearing failed after it was recorded: the %s record could not be made durable (%v); the switch stays engaged", ActionOff, err)
			k.record(ctx, &record.Admin{Action: ActionOn, Actor: actor, Reason: why})
			return errors.New(why)
		}
	}
	if path := k.File(); path != "" {
		if err := Remove(path); err != nil {
			// Recorded as cleared, but a restart would engage it again:
			// it stays engaged, and the log says so.
			why := fmt.Sprintf("clearing failed after it was recorded: the state file %s could not be removed (%v); the switch stays engaged", path, err)
			k.record(ctx, &record.Admin{Action: ActionOn, Actor: actor, Reason: why})
			return errors.New(why)
		}
	}
	k.on.Store(false)
	k.st = Status{}
	return nil
}

// record appends rec even if ctx ends meanwhile; a failure is logged.
func (k *Switch) record(ctx context.Context, rec record.Record) {
	if _, err := k.Log.Append(context.WithoutCancel(ctx), rec); err != nil {
		k.Logger.Error("audit append failed", "kind", rec.Kind(), "err", err)
	}
}

// Restore engages the kill switch at start if it was engaged when
// the previous gateway on this audit directory stopped (or its state file
// cannot be read), and records that it was carried over.
func (k *Switch) Restore(ctx context.Context) {
	path := k.File()
	if path == "" {
		return
	}
	st, err := Read(path)
	if st == nil && err == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.on.Store(true)
	var reason string
	if err != nil {
		st = &Status{Engaged: true, Since: time.Now().UTC(), Actor: RestartActor,
			Reason: fmt.Sprintf("the kill switch's state file cannot be read (%v): engaged to fail closed", err)}
		reason = "carried over from before the restart: " + st.Reason
		k.Logger.Error("the kill switch's state file cannot be read: the kill switch is ENGAGED (fail closed) and every tools/call is refused "+
			"until an operator clears it with POST /admin/kill-switch/clear (the admin: section must be configured); check the file first",
			"file", path, "err", err)
	} else {
		reason = fmt.Sprintf("carried over from before the restart: engaged at %s by %s", st.Since.UTC().Format(time.RFC3339), st.Actor)
		if st.Reason != "" {
			reason += ": " + st.Reason
		}
		k.Logger.Warn("the kill switch was engaged before the restart and stays ENGAGED: every tools/call is refused until an operator clears it "+
			"with POST /admin/kill-switch/clear", "since", st.Since, "actor", st.Actor, "reason", st.Reason, "file", path)
	}
	k.st = *st
	if _, err := k.Log.Append(context.WithoutCancel(ctx), &record.Admin{Action: ActionOn, Actor: RestartActor, Reason: reason}); err != nil {
		k.Logger.Error("record the carried-over kill switch (it stays engaged)", "err", err)
	}
}

// Status is the kill switch's state: who engaged it, when and why.
func (k *Switch) Status() Status {
	k.mu.RLock()
	defer k.mu.RUnlock()
	if !k.on.Load() {
		return Status{}
	}
	st := k.st
	st.Engaged = true
	return st
}

package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
)

// The kill switch outlives the process: while it is engaged its state is a
// small file in the audit directory (KillSwitchStateFile), written with
// fsync and rename before the kill_switch_on record, and removed (and the
// directory synced) only after the kill_switch_off record is durable (in
// interval durability, only after a checkpoint has synced it). A
// gateway that starts and finds the file starts engaged and records a
// kill_switch_on that says it was carried over; one that finds a file it
// cannot read starts engaged too (fail closed). Only the admin API clears
// it, recorded.

// KillSwitchStateFile is the name of the kill switch's state file in the
// audit directory; it exists only while the switch is engaged.
const KillSwitchStateFile = "kill-switch.json"

// Admin record actions of the kill switch.
const (
	AdminKillSwitchOn  = "kill_switch_on"
	AdminKillSwitchOff = "kill_switch_off"
)

// KillSwitchRestartActor is the actor of the kill_switch_on record a
// gateway writes at start when it carries the switch over from before the
// restart; the record's reason says who engaged it, when and why.
const KillSwitchRestartActor = "gateway-restart"

// maxKillState bounds the state file (it holds one reason string).
const maxKillState = 1 << 20

// writeKillState makes st the durable state: a temporary file, synced,
// renamed over path, and the directory synced.
func writeKillState(path string, st KillStatus) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(path))
}

// removeKillState removes the state file (absent is fine) and syncs the
// directory, so that the removal survives a crash.
func removeKillState(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// readKillState reads the state file: nil and no error when there is none.
// Anything else than a regular file holding one engaged state (a FIFO, a
// directory, an unreadable, truncated or foreign file) is an error, which
// the caller treats as engaged.
func readKillState(path string) (*KillStatus, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0) // a FIFO must not block the start
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKillState+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxKillState {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxKillState)
	}
	var st KillStatus
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: data after the JSON object", path)
	}
	if !st.Engaged {
		return nil, fmt.Errorf("%s does not say the switch is engaged (the gateway writes it only while it is)", path)
	}
	return &st, nil
}

// restoreKillSwitch engages the kill switch at start if it was engaged when
// the previous gateway on this audit directory stopped (or its state file
// cannot be read), and records that it was carried over.
func (g *Gateway) restoreKillSwitch(ctx context.Context) {
	path := g.opts.KillSwitchFile
	if path == "" {
		return
	}
	st, err := readKillState(path)
	if st == nil && err == nil {
		return
	}
	g.killMu.Lock()
	defer g.killMu.Unlock()
	g.killed.Store(true)
	var reason string
	if err != nil {
		st = &KillStatus{Engaged: true, Since: time.Now().UTC(), Actor: KillSwitchRestartActor,
			Reason: fmt.Sprintf("the kill switch's state file cannot be read (%v): engaged to fail closed", err)}
		reason = "carried over from before the restart: " + st.Reason
		g.logger.Error("the kill switch's state file cannot be read: the kill switch is ENGAGED (fail closed) and every tools/call is refused "+
			"until an operator clears it with POST /admin/kill-switch/clear (the admin: section must be configured); check the file first",
			"file", path, "err", err)
	} else {
		reason = fmt.Sprintf("carried over from before the restart: engaged at %s by %s", st.Since.UTC().Format(time.RFC3339), st.Actor)
		if st.Reason != "" {
			reason += ": " + st.Reason
		}
		g.logger.Warn("the kill switch was engaged before the restart and stays ENGAGED: every tools/call is refused until an operator clears it "+
			"with POST /admin/kill-switch/clear", "since", st.Since, "actor", st.Actor, "reason", st.Reason, "file", path)
	}
	g.kill = *st
	if _, err := g.log.Append(context.WithoutCancel(ctx), &auditlog.Admin{Action: AdminKillSwitchOn, Actor: KillSwitchRestartActor, Reason: reason}); err != nil {
		g.logger.Error("record the carried-over kill switch (it stays engaged)", "err", err)
	}
}

// KillStatus is the kill switch's state: who engaged it, when and why.
func (g *Gateway) KillStatus() KillStatus {
	g.killMu.RLock()
	defer g.killMu.RUnlock()
	if !g.killed.Load() {
		return KillStatus{}
	}
	st := g.kill
	st.Engaged = true
	return st
}

// Package killswitch is the gateway's kill switch (Switch): whether it is
// engaged, its kill_switch_on and kill_switch_off records, the lock under
// which the gateway appends what must not follow kill_switch_on, and its
// durable state: while an operator has engaged the switch, a small file
// in the audit directory (StateFile) says since when, by whom and why. It
// is written with fsync and rename, and removed with the directory
// synced, so that a gateway that restarts starts engaged. The refusals
// are the gateway core's; the admin listener engages and clears it.
package killswitch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Status is the kill switch's state, as the admin listener reports it
// (GET /admin/kill-switch) and the state file holds it.
type Status struct {
	Engaged bool      `json:"engaged"`
	Since   time.Time `json:"since,omitzero"`
	Actor   string    `json:"actor,omitzero"`
	Reason  string    `json:"reason,omitzero"`
}

// StateFile is the name of the kill switch's state file in the
// audit directory; it exists only while the switch is engaged.
const StateFile = "kill-switch.json"

// maxState bounds the state file (it holds one reason string).
const maxState = 1 << 20

// Write makes st the durable state: a temporary file, synced,
// renamed over path, and the directory synced.
func Write(path string, st Status) error {
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

// Remove removes the state file (absent is fine) and syncs the
// directory, so that the removal survives a crash.
func Remove(path string) error {
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

// Read reads the state file: nil and no error when there is none.
// Anything else than a regular file holding one engaged state (a FIFO, a
// directory, an unreadable, truncated or foreign file) is an error, which
// the caller treats as engaged.
func Read(path string) (*Status, error) {
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
	b, err := io.ReadAll(io.LimitReader(f, maxState+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxState {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxState)
	}
	var st Status
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

package auditlog

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
)

// cutBatch undoes a flush that failed: the lines of the batch that reached
// the segment (some of them when the disk filled part way through the
// write, all of them when the fdatasync after it failed) and the vault
// entries written with them are truncated off again, and the truncation is
// synced. Every Append of the batch reports the error, so none of its
// records may stay in the log: crash recovery at the next start keeps
// every complete line, and a call record there would read as forwarded for
// a call the gateway refused. Only the failed flush is cut; what earlier
// flushes wrote was acknowledged and stays (in interval mode unsynced
// records included). The writer stops either way (the caller makes err
// fatal). If the cut fails, the returned error says so: complete lines of
// the failed batch may then remain after the acknowledged records, and
// nothing in the log tells them apart (FORMAT.md section 8).
func (w *Writer) cutBatch(segStart, vaultStart int64, err error) error {
	if w.f != nil && w.segBytes > segStart {
		if cerr := cutFile(w.f, segStart); cerr != nil {
			return fmt.Errorf("%w; cutting the failed batch (%d bytes from offset %d) off %s failed too, so records whose append failed may remain in the log: %w",
				err, w.segBytes-segStart, segStart, filepath.Base(w.f.Name()), cerr)
		}
		w.segBytes = segStart // segHash still holds the cut bytes: the writer never rotates again
	}
	if w.vaultF != nil && w.vaultBytes > vaultStart {
		if cerr := cutFile(w.vaultF, vaultStart); cerr != nil {
			return fmt.Errorf("%w; cutting the failed batch's payloads (%d bytes from offset %d) off the vault failed too (payloads that no record refers to may remain there): %w",
				err, w.vaultBytes-vaultStart, vaultStart, cerr)
		}
		w.vaultBytes = vaultStart
	}
	return err
}

// cutFile truncates f to size and syncs it.
func cutFile(f *os.File, size int64) error {
	if err := f.Truncate(size); err != nil {
		return err
	}
	return f.Sync()
}

// removeEpoch removes the epoch directory of an Open that failed before its
// genesis record was durable (a full disk, typically): nothing in it was
// ever acknowledged, and the log is left as it was before the attempt, so
// that verify-chain does not meet an epoch without a record. Best effort:
// what cannot be removed, the next start's recovery moves aside as an
// aborted epoch.
func (w *Writer) removeEpoch() {
	for _, name := range []string{logdir.SegmentName(1), VaultFile} {
		os.Remove(filepath.Join(w.epochDir, name))
	}
	if os.Remove(w.epochDir) == nil {
		logdir.SyncDir(w.dir)
	}
}

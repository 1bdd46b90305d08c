package auditlog

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/scan"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// recoverEpoch examines the newest existing epoch before a new one starts.
// A sealed epoch is only summarised. An unsealed one (the writer crashed)
// may end with an incomplete or damaged tail after its last checkpoint: the
// tail is saved to "<segment>.torn-<time>", cut off and described in the
// returned Recovery record. Damage before the last checkpoint is refused.
func recoverEpoch(dir string, epoch int) (*record.Predecessor, *record.Recovery, error) {
	var d scan.Detail
	res, err := scan.Epoch(dir, epoch, scan.Options{TolerateTail: true, Detail: &d})
	if err != nil && d.Empty {
		// The writer died before the genesis record was durable: nothing
		// was ever acknowledged in this epoch. Move it aside and look at
		// the one before.
		aside := filepath.Join(dir, fmt.Sprintf("aborted-%s-%s", logdir.EpochName(epoch), time.Now().UTC().Format("20060102T150405.000000000Z")))
		if err := os.Rename(filepath.Join(dir, logdir.EpochName(epoch)), aside); err != nil {
			return nil, nil, fmt.Errorf("move aside the empty epoch %d: %w", epoch, err)
		}
		if err := logdir.SyncDir(dir); err != nil {
			return nil, nil, err
		}
		epochs, err := logdir.ListEpochs(dir)
		if err != nil || len(epochs) == 0 {
			return nil, nil, err
		}
		return recoverEpoch(dir, epochs[len(epochs)-1])
	}
	if err == nil && d.TailErr != nil && res.Records == 0 {
		// A complete genesis line that does not verify is no crash's
		// doing (a torn one is handled above): refuse to build on it.
		err = d.TailErr
	}
	if err != nil {
		var ve *record.VerifyError
		if errors.As(err, &ve) && ve.Class != record.ClassIO {
			return nil, nil, &record.TamperError{Dir: dir, Err: ve}
		}
		return nil, nil, fmt.Errorf("read the previous epoch: %w", err)
	}
	pred := &record.Predecessor{Epoch: epoch, Origin: res.Origin, Size: res.Records, Root: res.Root[:], Sealed: res.Sealed}
	if res.Sealed {
		return pred, nil, nil
	}
	rec := &record.Recovery{Epoch: epoch, Origin: res.Origin, Records: res.Records, Unsealed: res.Unsealed, Root: res.Root[:], File: filepath.Base(d.LastFile)}
	var cut int64 = -1
	switch {
	case d.TailErr != nil:
		cut = d.TailStart
		rec.Reason = "damaged record after the last checkpoint: " + d.TailErr.Msg
	case res.TornBytes > 0:
		cut = res.TornAt.Offset
		rec.Reason = "incomplete final line (the writer stopped mid-write)"
	default:
		rec.Reason = "the epoch was not sealed (the writer stopped without closing); nothing to cut"
	}
	if cut >= 0 {
		path := d.LastFile
		if d.TailErr != nil {
			path = d.TailErr.Pos.File
		}
		rec.File = filepath.Base(path)
		rec.Offset = cut
		n, sum, saved, err := cutTail(path, cut)
		if err != nil {
			return nil, nil, fmt.Errorf("recover epoch %d: %w", epoch, err)
		}
		rec.DroppedBytes, rec.DroppedSHA256, rec.SavedAs = n, sum, saved
		// What is left may be a sealed epoch with bytes appended after
		// its final checkpoint: the predecessor is described as it is now.
		pred.Sealed = d.EndsSealed
	}
	return pred, rec, nil
}

// cutTail copies path[off:] to a side file, truncates path at off and syncs.
// The tail is streamed (a crash can leave one of any length) and hashed on
// the way; the side file is synced before the segment is cut.
func cutTail(path string, off int64) (int64, []byte, string, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return 0, nil, "", err
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return 0, nil, "", err
	}
	saved := filepath.Base(path) + ".torn-" + time.Now().UTC().Format("20060102T150405.000000000Z")
	sf, err := os.OpenFile(filepath.Join(filepath.Dir(path), saved), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, nil, "", fmt.Errorf("save the cut tail: %w", err)
	}
	sum := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(sf, sum), struct{ io.Reader }{f}, make([]byte, 1<<20))
	if err == nil {
		err = sf.Sync()
	}
	if cerr := sf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, nil, "", fmt.Errorf("save the cut tail: %w", err)
	}
	if err := f.Truncate(off); err != nil {
		return 0, nil, "", fmt.Errorf("cut the tail of %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return 0, nil, "", fmt.Errorf("sync %s: %w", path, err)
	}
	if err := logdir.SyncDir(filepath.Dir(path)); err != nil {
		return 0, nil, "", err
	}
	return n, sum.Sum(nil), saved, nil
}

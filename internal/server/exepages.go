package server

import (
	"sync"
	"time"

	"github.com/confidential-mcp/cmcp/internal/exepages"
)

// releaseStartPages gives back the pages of the executable that start-up
// touched (package initialisation, configuration, policy, the audit
// log's opening) and serving may never use again: the gateway's peak RSS
// at 8 sessions fell from ~31 to ~21 MiB (internal/bench/BENCHMARKS.md).
// CMCP_KEEP_EXE_PAGES=1 keeps them. It takes ~5-20 ms (one madvise per
// page of text): with --stdio an agent waits for its first answer, so
// there it runs while the session is served. Failing to release is no
// reason to stop: it is logged. It runs once per process: the pages a
// second Serve in the same process (tests run many) would give back are
// the ones serving uses, and each release makes them fault in again, page
// by page (internal/server's tests took a third more CPU with a release
// per Serve).
func (s *serve) releaseStartPages() error {
	if s.o.Stdio {
		go s.release()
	} else {
		s.release()
	}
	return nil
}

// releaseMu guards releasedOnce, set once a release has been made in
// this process. A Serve that keeps the pages (CMCP_KEEP_EXE_PAGES=1) or
// is refused (a bad value, said in its log) does not count: the next
// Serve still releases them.
var (
	releaseMu    sync.Mutex
	releasedOnce bool
)

func (s *serve) release() {
	releaseMu.Lock()
	defer releaseMu.Unlock()
	if releasedOnce {
		return
	}
	began := time.Now()
	st, released, err := exepages.ReleaseFor(s.o.Environ)
	releasedOnce = released
	switch {
	case err != nil:
		s.logger.Warn("the executable's start-up pages stay resident", "err", err)
	case released:
		s.logger.Debug("the executable's start-up pages released", "bytes", st.Bytes, "mappings", st.Mappings, "pieces", st.Pieces, "skipped", st.Skipped, "took", time.Since(began))
	}
}

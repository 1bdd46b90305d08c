package toolprobe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/upstream"
)

// Bounds of one listing of an upstream's tools (tools/list and the pages
// its nextCursor leads to). An upstream that pages for ever, repeats a
// cursor or lists more tools than any agent could choose from is refused
// rather than followed: following it would hold a goroutine and grow the
// gateway's memory for as long as the upstream cares to.
const (
	MaxToolPages = 100
	MaxTools     = 10000
)

// ListTools lists an upstream's tools, following nextCursor, within d
// (connect_timeout; 0: ctx alone bounds it), at most MaxToolPages pages and
// MaxTools tools; a cursor the upstream already gave is an error (a loop).
func ListTools(ctx context.Context, cs *mcp.ClientSession, d time.Duration) ([]*mcp.Tool, error) {
	lctx, cancel := ctx, context.CancelFunc(func() {})
	if d > 0 {
		lctx, cancel = context.WithTimeout(ctx, d)
	}
	defer cancel()
	var tools []*mcp.Tool
	seen := map[string]bool{}
	params := &mcp.ListToolsParams{}
	for page := 1; ; page++ {
		res, err := cs.ListTools(lctx, params)
		if err != nil {
			if lctx.Err() != nil && ctx.Err() == nil {
				err = fmt.Errorf("did not answer within %s (connect_timeout): %w", d, err)
			}
			return nil, fmt.Errorf("tools/list: %w", err)
		}
		tools = append(tools, res.Tools...)
		switch {
		case len(tools) > MaxTools:
			return nil, fmt.Errorf("tools/list: more than %d tools in %d pages: refused (the gateway exposes at most %d tools of an upstream)", MaxTools, page, MaxTools)
		case res.NextCursor == "":
			return tools, nil
		case page == MaxToolPages:
			return nil, fmt.Errorf("tools/list: still a next page after %d pages (%d tools): refused (the gateway follows at most %d pages)", page, len(tools), MaxToolPages)
		case seen[res.NextCursor]:
			return nil, fmt.Errorf("tools/list: page %d gave a nextCursor an earlier page gave: the listing would never end", page)
		}
		seen[res.NextCursor] = true
		params = &mcp.ListToolsParams{Cursor: res.NextCursor}
	}
}

// ErrConnectTimeout is what ConnectWithin returns when d passed first.
var ErrConnectTimeout = errors.New("connect timeout")

// ConnectWithin runs connect but gives up after d: the attempt is cancelled
// (a child that never answers is stopped) and a connection that completes
// anyway is closed. A successful connection's context is never cancelled.
func ConnectWithin(ctx context.Context, d time.Duration, connect func(context.Context) (*upstream.Conn, error)) (*upstream.Conn, error) {
	type res struct {
		c   *upstream.Conn
		err error
	}
	cctx, cancel := context.WithCancel(ctx)
	abort := func() { cancel() } // only on failure: a live session keeps its context
	ch := make(chan res, 1)
	go func() {
		c, err := connect(cctx)
		ch <- res{c, err}
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case r := <-ch:
		if r.err != nil {
			abort()
		}
		return r.c, r.err
	case <-t.C:
		abort()
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, ErrConnectTimeout
	}
}

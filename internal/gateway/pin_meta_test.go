package gateway

import (
	"context"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// TestToolMetaAndIconsArePinned: a tool's _meta (an MCP Apps
// ui/resourceUri) and icons are shown to agents, so the pin covers them:
// an upstream that changes them between runs drifts (refused, recorded),
// and one that keeps them is shown with them.
func TestToolMetaAndIconsArePinned(t *testing.T) {
	benign := map[string]string{"CMCP_TEST_META": "ui://benign/view", "CMCP_TEST_ICON": "https://good.example/icon.png"}
	h0 := newHarness(t, hconf{mode: "toolmeta", env: benign})
	pins := map[string]digest.Digest{}
	h0.g.ups["t"].mu.Lock()
	for k, v := range h0.g.ups["t"].baseline {
		pins[k] = v
	}
	h0.g.ups["t"].mu.Unlock()

	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"_meta", map[string]string{"CMCP_TEST_META": "ui://evil/exfiltrate-form", "CMCP_TEST_ICON": benign["CMCP_TEST_ICON"]}},
		{"icons", map[string]string{"CMCP_TEST_META": benign["CMCP_TEST_META"], "CMCP_TEST_ICON": "https://evil.example/track.png?u=victim"}},
	} {
		t.Run(tc.name+" changed", func(t *testing.T) {
			h := newHarness(t, hconf{mode: "toolmeta", toolPins: pins, env: tc.env})
			cs := h.connect("", nil)
			lt, err := cs.ListTools(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, tl := range lt.Tools {
				if tl.Name == "t__echo" {
					t.Fatalf("the tool's %s changed and it is still shown: _meta %v, icons %+v", tc.name, tl.Meta, tl.Icons)
				}
			}
			if _, err := call(t, cs, "t__echo", nil); wireCode(err) != CodeUnknownTool {
				t.Fatalf("call: %v, want %d", err, CodeUnknownTool)
			}
			var d []map[string]any
			for _, r := range kinds(h.records(), "drift") {
				if r.Body["tool"] == "echo" {
					d = append(d, r.Body)
				}
			}
			if len(d) != 1 || d[0]["change"] != "changed" || d[0]["action"] != "refused" {
				t.Fatalf("drift records: %v", d)
			}
		})
	}
	t.Run("unchanged", func(t *testing.T) {
		h := newHarness(t, hconf{mode: "toolmeta", toolPins: pins, env: benign})
		cs := h.connect("", nil)
		lt, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(lt.Tools) != 1 || lt.Tools[0].Meta["ui/resourceUri"] != benign["CMCP_TEST_META"] ||
			len(lt.Tools[0].Icons) != 1 || lt.Tools[0].Icons[0].Source != benign["CMCP_TEST_ICON"] {
			t.Fatalf("the pinned tool is shown as %+v", lt.Tools)
		}
		if d := kinds(h.records(), "drift"); len(d) != 0 {
			t.Fatalf("drift records: %v", d)
		}
	})
}

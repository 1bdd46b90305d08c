package cli

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/mod/sumdb/note"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
)

// TestVerifyChainForgedSavedCheckpoint: a saved checkpoint (--checkpoint)
// is only evidence if its epoch's key signed it. One whose signature was
// altered fails with exit 11, one signed by another key under the epoch's
// name with exit 12, with or without --key, even when its size and root
// are the log's own (so nothing else would notice). These paths were
// untested: skipping the signature check passed every test (found in
// review).
func TestVerifyChainForgedSavedCheckpoint(t *testing.T) {
	l, saved := base(t)
	raw, err := os.ReadFile(saved)
	if err != nil {
		t.Fatal(err)
	}
	text, sigs, ok := bytes.Cut(raw, []byte("\n\n"))
	origin, _, _ := strings.Cut(string(text), "\n")
	f := strings.Fields(string(sigs))
	if !ok || len(f) != 3 || f[0] != "—" || f[1] != origin {
		t.Fatalf("saved checkpoint %q: want one signature by %s", raw, origin)
	}

	// The signature bytes altered: same key name and hash, a bad signature.
	sig, err := base64.StdEncoding.DecodeString(f[2])
	if err != nil {
		t.Fatal(err)
	}
	sig[len(sig)-1] ^= 1
	badSig := append(append([]byte{}, text...), []byte("\n\n— "+origin+" "+base64.StdEncoding.EncodeToString(sig)+"\n")...)

	// The same text signed by another key with the epoch's name.
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	signer, _, err := c2sp.NewNoteKeys(origin, other)
	if err != nil {
		t.Fatal(err)
	}
	otherKey, err := note.Sign(&note.Note{Text: string(text) + "\n"}, signer)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		cp   []byte
		code int
		want string
	}{
		{"bad signature", badSig, exitcode.ExitLogSig, "has a bad signature"},
		{"another key", otherKey, exitcode.ExitLogKey, "is not signed by a trusted key"},
	} {
		for _, withKey := range []bool{true, false} {
			name := tc.name + ", the epoch's key"
			if withKey {
				name = tc.name + ", --key"
			}
			t.Run(name, func(t *testing.T) {
				p := filepath.Join(t.TempDir(), "forged.cp")
				if err := os.WriteFile(p, tc.cp, 0o600); err != nil {
					t.Fatal(err)
				}
				args := []string{"verify-chain", l.dir, "--checkpoint", p}
				if withKey {
					args = append(args, "--key", l.vkey)
				}
				code, out, errOut := runCLI(t, args...)
				if code != tc.code || !strings.Contains(errOut, tc.want) {
					t.Fatalf("exit %d, want %d and %q\n%s%s", code, tc.code, tc.want, out, errOut)
				}
			})
		}
	}
}

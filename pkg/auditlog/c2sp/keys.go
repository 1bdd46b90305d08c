package c2sp

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"golang.org/x/mod/sumdb/note"
)

// LoadOrCreateLogKey reads the log key kept at path (a note private key,
// "PRIVATE+KEY+<origin>+<hash>+<base64>", as x/mod/sumdb/note writes them)
// or, if path does not exist, creates one for origin there (mode 0600).
// A key made for another origin is refused.
func LoadOrCreateLogKey(path, origin string) (ed25519.PrivateKey, error) {
	if strings.ContainsAny(origin, " +\t\n") || origin == "" {
		return nil, fmt.Errorf("log origin %q: must be non-empty, without spaces or '+'", origin)
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		skey, _, err := note.GenerateKey(rand.Reader, origin)
		if err != nil {
			return nil, fmt.Errorf("generate the log key: %w", err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("create the log key's directory: %w", err)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("create the log key %s: %w", path, err)
		}
		_, werr := f.WriteString(skey + "\n")
		if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
			os.Remove(path)
			return nil, fmt.Errorf("write the log key %s: %w", path, err)
		}
		if err := logdir.SyncDir(filepath.Dir(path)); err != nil {
			return nil, err
		}
		b = []byte(skey)
	} else if err != nil {
		return nil, fmt.Errorf("read the log key: %w", err)
	}
	return parseLogKey(path, strings.TrimSpace(string(b)), origin)
}

func parseLogKey(path, skey, origin string) (ed25519.PrivateKey, error) {
	// PRIVATE+KEY+<name>+<hash8>+<base64(0x01||seed)>
	parts := strings.SplitN(skey, "+", 5)
	if len(parts) != 5 || parts[0] != "PRIVATE" || parts[1] != "KEY" {
		return nil, fmt.Errorf("log key %s is not a note private key (want PRIVATE+KEY+<origin>+<hash>+<base64>)", path)
	}
	if parts[2] != origin {
		return nil, fmt.Errorf("log key %s is for origin %q, not %q: a log keeps its origin; move the key aside to start a new log identity", path, parts[2], origin)
	}
	raw, err := base64.StdEncoding.DecodeString(parts[4])
	if err != nil || len(raw) != 1+ed25519.SeedSize || raw[0] != 0x01 {
		return nil, fmt.Errorf("log key %s: not an Ed25519 note key", path)
	}
	return ed25519.NewKeyFromSeed(raw[1:]), nil
}

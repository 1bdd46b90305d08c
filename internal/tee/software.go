package tee

import (
	"context"
	"crypto/ed25519"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

type software struct{ now func() time.Time }

// NewSoftware returns the development provider: its bundles carry the binding
// but no hardware evidence, are marked "attested": false with the note
// evidence.SoftwareLabel, and never verify as hardware.
func NewSoftware(now func() time.Time) Provider {
	if now == nil {
		now = time.Now
	}
	return software{now: now}
}

func (software) Platform() string  { return evidence.PlatformSoftware }
func (software) Collector() string { return "software" }

func (s software) Attest(ctx context.Context, pub ed25519.PublicKey, nonce []byte, statement digest.Digest) (*evidence.Bundle, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, err := evidence.NewBinding(pub, nonce, statement)
	if err != nil {
		return nil, err
	}
	return &evidence.Bundle{
		Format:      evidence.Format,
		Platform:    evidence.PlatformSoftware,
		Attested:    false,
		Note:        evidence.SoftwareLabel,
		Binding:     b,
		Collector:   "software",
		CollectedAt: s.now().UTC(),
	}, nil
}

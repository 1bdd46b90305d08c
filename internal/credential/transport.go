package credential

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Transport puts identity's credential for the broker's upstream on every
// request (Authorization: Bearer), replacing any Authorization header the
// request had: the agent's own token is never forwarded upstream.
//
// A 401 answer means the upstream refused the request before acting on it
// (authentication comes first), so the request is sent again:
//
//   - on a credential the upstream never accepted before (just minted),
//     the 401 is a propagation race: the same credential is sent again
//     after Retry's backoff, until accepted or the attempts run out;
//   - on one it accepted before, the credential was revoked: it is dropped
//     and a new one minted at once, without sleeping, and that one gets
//     the treatment of a fresh credential.
//
// A 401 after that ends with an error that names the upstream and the
// identity (never the credential). A request whose body cannot be read
// again (no GetBody) is not replayed.
type Transport struct {
	Broker   *Broker
	Identity Identity
	Base     http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	cred, err := t.Broker.Get(ctx, t.Identity)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	resp, err := t.send(req, cred, true)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		return resp, err
	}
	if !replayable(req) {
		return resp, nil
	}
	reminted := false
	if cred.accepted.Load() {
		// Revoked: a new credential at once.
		discard(resp)
		if cred, err = t.Broker.Refused(ctx, t.Identity, cred); err != nil {
			return nil, err
		}
		reminted = true
		if resp, err = t.send(req, cred, false); err != nil || resp.StatusCode != http.StatusUnauthorized {
			return resp, err
		}
	}
	// Not accepted yet: the upstream may not know it yet.
	r := t.Broker.opts.Retry
	for i := range r.Attempts {
		discard(resp)
		timer := time.NewTimer(r.delay(i))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("upstream %q: waiting for the upstream to accept the credential minted for %q (%d of %d retries after HTTP 401): %w",
				t.Broker.upstream, t.Identity.Name, i, r.Attempts, context.Cause(ctx))
		case <-timer.C:
		}
		if resp, err = t.send(req, cred, false); err != nil || resp.StatusCode != http.StatusUnauthorized {
			return resp, err
		}
		if cred.accepted.Load() {
			break // accepted by another request meanwhile, refused now: revoked again
		}
	}
	discard(resp)
	what := "a credential minted for it"
	if reminted {
		what = "a credential minted again for it after the cached one was refused"
	}
	return nil, &RefusedError{Upstream: t.Broker.upstream, Identity: t.Identity.Name, Source: t.Broker.src.Kind(),
		Detail: fmt.Sprintf("HTTP 401 to %s (fingerprint %s), also after %d retries", what, cred.fingerprint, r.Attempts)}
}

// send sends req (again, unless first) with cred and marks cred accepted
// unless the answer is 401.
func (t *Transport) send(req *http.Request, cred *Credential, first bool) (*http.Response, error) {
	r := req.Clone(req.Context())
	if !first && req.GetBody != nil {
		body, err := req.GetBody()
		if err != nil {
			return nil, fmt.Errorf("upstream %q: read the request again to resend it: %w", t.Broker.upstream, err)
		}
		r.Body = body
	}
	r.Header["Authorization"] = cred.auth // the clone's header is its own copy
	resp, err := t.Base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	resp.Request = req // not the clone, which has the credential
	if resp.StatusCode != http.StatusUnauthorized && !cred.accepted.Load() {
		cred.accepted.Store(true)
	}
	return resp, nil
}

// replayable reports whether req can be sent again: it has no body, or one
// GetBody reads again.
func replayable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

func discard(resp *http.Response) {
	_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
	resp.Body.Close()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// RefusedError is a call that failed because the upstream refused the
// credential minted for the identity. It names both, never the credential.
type RefusedError struct {
	Upstream, Identity, Source string
	Detail                     string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("upstream %q refused the %s credential of %q: %s; check that the identity may use the upstream, and the source's configuration",
		e.Upstream, e.Source, e.Identity, e.Detail)
}

// Unwrap is ErrRefused.
func (e *RefusedError) Unwrap() error { return ErrRefused }

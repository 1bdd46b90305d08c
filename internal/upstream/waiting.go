package upstream

import "context"

type waitingKey struct{}

// WithWaiting returns a context carrying f, which a raw call made with it
// runs once its request is on its way to the upstream (written to a
// child's stdin, or about to be POSTed), when the caller has nothing left
// to do but wait. The stdio front end resumes reading the agent's
// messages then, so that starting a reader is not on the call's path.
func WithWaiting(ctx context.Context, f func()) context.Context {
	return context.WithValue(ctx, waitingKey{}, f)
}

// Waiting runs the function WithWaiting put in ctx, if any. Code that may
// block for long before a call is sent (starting an upstream) calls it
// first.
func Waiting(ctx context.Context) {
	if f, _ := ctx.Value(waitingKey{}).(func()); f != nil {
		f()
	}
}

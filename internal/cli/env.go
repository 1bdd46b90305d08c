package cli

import "strings"

// getenv looks name up in the environment cmcp was given (e.environ), not
// in the process environment, so that tests can run Main with their own.
func (e *env) getenv(name string) string {
	for i := len(e.environ) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(e.environ[i], name+"="); ok {
			return v
		}
	}
	return ""
}

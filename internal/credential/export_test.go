package credential

import (
	"errors"
	"time"
)

// ParseExecOutputForTest is parseExecOutput, for the table test.
func ParseExecOutputForTest(b []byte) (Token, error) {
	return parseExecOutput(b, time.Now(), func(msg string) error { return errors.New(msg) })
}

package server

import (
	"testing"
)

func TestCheckListen(t *testing.T) {
	for _, tc := range []struct {
		addr string
		auth bool
		ok   bool
	}{{"127.0.0.1:0", false, true}, {"[::1]:9", false, true}, {"localhost:1", false, true}, {"0.0.0.0:9", false, false}, {"10.1.2.3:9", false, false}, {"0.0.0.0:9", true, true}} {
		err := CheckListen(tc.addr, tc.auth)
		if (err == nil) != tc.ok {
			t.Errorf("CheckListen(%q, %v) = %v", tc.addr, tc.auth, err)
		}
	}
}

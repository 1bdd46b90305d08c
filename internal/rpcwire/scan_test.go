package rpcwire

import (
	"reflect"
	"testing"
)

// TestEachMember: the members of a valid object, in order and byte for
// byte; false for anything that is not an object and for a name with an
// escape (the caller must decode those in full).
func TestEachMember(t *testing.T) {
	type kv struct{ k, v string }
	for _, tc := range []struct {
		in   string
		want []kv
		ok   bool
	}{
		{`{}`, nil, true},
		{` { } `, nil, true},
		{`{"a":1}`, []kv{{"a", "1"}}, true},
		{"{ \"a\" :\t\"x,}]\\\"\" ,\n\"b\":{\"c\":[1,{\"d\":\"}\"}]},\"e\":null,\"f\":-1.5e3 }",
			[]kv{{"a", `"x,}]\""`}, {"b", `{"c":[1,{"d":"}"}]}`}, {"e", "null"}, {"f", "-1.5e3"}}, true},
		{`{"a":[],"b":true}`, []kv{{"a", "[]"}, {"b", "true"}}, true},
		{`{"\u0061":1}`, nil, false},
		{`[1]`, nil, false},
		{`"s"`, nil, false},
		{``, nil, false},
	} {
		var got []kv
		ok := EachMember([]byte(tc.in), func(k, v []byte) { got = append(got, kv{string(k), string(v)}) })
		if ok != tc.ok || (ok && !reflect.DeepEqual(got, tc.want)) {
			t.Errorf("EachMember(%q) = %v %v, want %v %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

package auditlog

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"strconv"
	"testing"
)

// refHMAC is HMAC-SHA256 from crypto/hmac, the definition FORMAT.md §6 uses.
func refHMAC(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// TestHMACSHA256 checks the pooled HMAC-SHA256 against crypto/hmac for keys
// shorter than, equal to and longer than a SHA-256 block.
func TestHMACSHA256(t *testing.T) {
	for _, kl := range []int{0, 1, 31, 32, 33, 63, 64, 65, 100, 200} {
		key := bytes.Repeat([]byte{byte(kl), 0xa5}, kl)[:kl]
		for _, ml := range []int{0, 1, 33, 55, 56, 64, 119, 200, 1000} {
			msg := bytes.Repeat([]byte{0x5a, byte(ml)}, ml)[:ml]
			m := getMAC()
			got := m.mac([]byte("keep"), key, payloadLabel, msg)
			macPool.Put(m)
			want := append([]byte("keep"), refHMAC(key, []byte("cmcp/audit/payload/v1\x00"), msg)...)
			if !bytes.Equal(got, want) {
				t.Errorf("key %d bytes, message %d bytes: %x, crypto/hmac %x", kl, ml, got, want)
			}
			if !bytes.Equal(commitMAC(key, msg), want[4:]) {
				t.Errorf("commitMAC, key %d bytes, message %d bytes: differs from crypto/hmac", kl, ml)
			}
		}
	}
}

// TestCommitmentKeys checks the writer's precomputed key derivation (and its
// fallback without precomputed states) against the formula of FORMAT.md §6
// computed with crypto/hmac, and the commitment against CheckCommitment.
func TestCommitmentKeys(t *testing.T) {
	secret := bytes.Repeat([]byte{0x42, 0x17, 0xee, 0x01}, 8)
	fast := newKeyDeriver(secret)
	if fast.inner == nil {
		t.Fatal("no precomputed states for a 32-byte secret")
	}
	slow := &keyDeriver{secret: secret}
	payload := []byte(`{"path":"/tmp/x"}`)
	for _, id := range []int64{0, 1, 9, 10, 12345, 1<<53 + 1, 1<<63 - 1} {
		k := refHMAC(secret, []byte("cmcp/audit/commit-key/v1\x00"), []byte(strconv.FormatInt(id, 10)))
		if got := commitKey(secret, id); !bytes.Equal(got, k) {
			t.Errorf("commitKey(%d) = %x, want %x", id, got, k)
		}
		want := refHMAC(k, []byte("cmcp/audit/payload/v1\x00"), payload)
		for name, d := range map[string]*keyDeriver{"precomputed": fast, "fallback": slow} {
			c := d.commitment(id, payload)
			if c.ID != id || c.Size != int64(len(payload)) || !bytes.Equal(c.MAC, want) {
				t.Errorf("%s: commitment %d = %v, want MAC %x", name, id, c, want)
			}
			if !CheckCommitment(k, c, payload) || CheckCommitment(k, c, append(payload, ' ')) {
				t.Errorf("%s: CheckCommitment does not accept exactly the committed payload", name)
			}
		}
	}
}

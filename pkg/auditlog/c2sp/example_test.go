package c2sp_test

import (
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// A log signs a checkpoint of its tree with its note key; whoever holds
// the verifier key opens it and learns the tree's size and root.
func ExampleOpenCheckpoint() {
	key := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)) // a fixed key for the example
	signer, vkey, err := c2sp.NewNoteKeys("example.com/log", key)
	if err != nil {
		panic(err)
	}
	root := tlog.Hash(sha256.Sum256([]byte("records")))
	signed, err := note.Sign(&note.Note{Text: c2sp.CheckpointBody("example.com/log", 42, root)}, signer)
	if err != nil {
		panic(err)
	}

	v, err := note.NewVerifier(vkey)
	if err != nil {
		panic(err)
	}
	cp, err := c2sp.OpenCheckpoint(signed, note.VerifierList(v))
	if err != nil {
		panic(err)
	}
	fmt.Println(cp.Origin, cp.Size, cp.Root == root)

	// Under another key of the same name the signature is not trusted.
	seed := make([]byte, ed25519.SeedSize)
	seed[0] = 1
	_, otherVkey, _ := c2sp.NewNoteKeys("example.com/log", ed25519.NewKeyFromSeed(seed))
	ov, _ := note.NewVerifier(otherVkey)
	_, err = c2sp.OpenCheckpoint(signed, note.VerifierList(ov))
	fmt.Println(err != nil)
	// Output:
	// example.com/log 42 true
	// true
}

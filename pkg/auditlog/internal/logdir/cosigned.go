package logdir

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	jsonv2 "github.com/go-json-experiment/json"
)

// CosignedLine is one line of witness.jsonl (auditlog.CosignedLine).
type CosignedLine struct {
	Note string `json:"note"` // a log checkpoint: the log key's signature and one or more cosignatures
}

// ReadCosigned reads an epoch's witness.jsonl (absent: none) and returns
// the notes it keeps, in order.
func ReadCosigned(epochDir string) ([][]byte, error) {
	b, err := os.ReadFile(filepath.Join(epochDir, WitnessFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for i, line := range bytes.Split(b, []byte("\n")) {
		if len(line) == 0 {
			if i == bytes.Count(b, []byte("\n")) {
				break
			}
			return nil, fmt.Errorf("%s line %d is empty", WitnessFile, i+1)
		}
		var c CosignedLine
		if err := jsonv2.Unmarshal(line, &c, jsonv2.RejectUnknownMembers(true)); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", WitnessFile, i+1, err)
		}
		out = append(out, []byte(c.Note))
	}
	return out, nil
}

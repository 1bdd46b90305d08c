package attestedlog_test

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/confidential-mcp/cmcp/pkg/attestedlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// Verify an audit log as `cmcp verify-chain --key KEYS` does, including the
// attestation evidence in each epoch's genesis record, with pkg/ alone. The
// fixture log's epochs carry software evidence: it binds each epoch's key
// and statement but proves no hardware, so it verifies as unattested (with
// RequireAttested it fails).
func ExampleGenesisCheck() {
	keys, err := os.ReadFile("../../testdata/auditlog/keys")
	if err != nil {
		fmt.Println(err)
		return
	}
	check := &attestedlog.GenesisCheck{} // the embedded AMD and Intel roots, no reference values
	report, err := auditlog.Verify("../../testdata/auditlog/log", auditlog.VerifyOptions{
		Keys:           strings.Fields(string(keys)),
		VerifyEvidence: check.Check,
	})
	if err != nil {
		fmt.Println("FAIL:", err)
		return
	}
	fmt.Printf("verified: %d records in %d epochs\n", report.Records, len(report.Epochs))
	for _, r := range check.Results {
		fmt.Printf("epoch %d: %s evidence, attested %v, binding %s: %s\n", r.Epoch, r.Platform, r.Attested, r.Binding, r.Note)
	}

	strict := &attestedlog.GenesisCheck{RequireAttested: true}
	_, err = auditlog.Verify("../../testdata/auditlog/log", auditlog.VerifyOptions{Keys: strings.Fields(string(keys)), VerifyEvidence: strict.Check})
	var verr *record.VerifyError
	if errors.As(err, &verr) {
		fmt.Println("with RequireAttested:", verr.Class)
	}
	// Output:
	// verified: 34 records in 2 epochs
	// epoch 1: software evidence, attested false, binding ours: software evidence: the key is unattested (development only)
	// epoch 2: software evidence, attested false, binding ours: software evidence: the key is unattested (development only)
	// with RequireAttested: key
}

package evidence

import (
	"fmt"
	"strings"
	"time"
)

// Status is an EAR-like appraisal status (draft-ietf-rats-ear).
type Status string

// Statuses, from best to worst. StatusNone means the claim does not apply.
const (
	StatusNone            Status = "none"
	StatusAffirming       Status = "affirming"
	StatusWarning         Status = "warning"
	StatusContraindicated Status = "contraindicated"
)

func (s Status) rank() int {
	switch s {
	case StatusAffirming:
		return 1
	case StatusWarning:
		return 2
	case StatusContraindicated:
		return 3
	}
	return 0
}

// Failure classes: which part of the evidence a contraindicated claim is about.
type Failure string

// Failure classes, mapped to distinct exit codes by the CLI.
const (
	FailEvidence Failure = "evidence"  // malformed, bad signature, chain to an unpinned root, software evidence
	FailBinding  Failure = "binding"   // key, nonce or statement not bound
	FailRefValue Failure = "ref-value" // measurement, policy (debug), TCB, host data
)

// Claim names.
const (
	ClaimEvidence    = "evidence"    // signature chain and report signature
	ClaimRoots       = "roots"       // which trust anchors were used
	ClaimBinding     = "binding"     // report data binds key and statement
	ClaimFreshness   = "freshness"   // the bound nonce is the verifier's
	ClaimDebug       = "debug"       // debug disabled (always required)
	ClaimPolicy      = "policy"      // guest policy / attributes beyond debug
	ClaimMeasurement = "measurement" // launch measurement / MRTD and RTMRs
	ClaimHostData    = "host-data"   // SNP HOST_DATA / TDX MRCONFIGID
	ClaimTCB         = "tcb"         // minimum TCB / TCB status
)

// Claim is one appraised fact.
type Claim struct {
	Name    string  `json:"name"`
	Status  Status  `json:"status"`
	Reason  string  `json:"reason"`
	Failure Failure `json:"failure,omitempty"` // set when contraindicated
}

// Binding states reported in Result.Binding.
const (
	BindingOurs          = "ours"           // report data is cmcp's binding of the bundle's key, nonce and statement
	BindingMismatch      = "mismatch"       // it is not
	BindingNotApplicable = "not-applicable" // raw evidence: no cmcp binding to check
)

// Result is the appraisal of one piece of evidence.
type Result struct {
	Platform string `json:"platform"`
	// Attested is true only for SEV-SNP or TDX evidence that verified: its
	// verdict is affirming or warning (signature chain, binding and
	// reference values not contraindicated). Evidence that names a hardware
	// platform but did not verify, and software evidence, are not attested.
	Attested   bool              `json:"attested"`
	Verdict    Status            `json:"verdict"`
	Binding    string            `json:"binding"`
	Claims     []Claim           `json:"claims"`
	Report     map[string]string `json:"report,omitempty"` // parsed fields (hex), for people and programs
	Roots      string            `json:"roots"`
	VerifiedAt time.Time         `json:"verified_at"`
}

func (r *Result) add(name string, st Status, fail Failure, format string, args ...any) {
	c := Claim{Name: name, Status: st, Reason: fmt.Sprintf(format, args...)}
	if st == StatusContraindicated {
		c.Failure = fail
	}
	r.Claims = append(r.Claims, c)
}

func (r *Result) field(k, v string) {
	if r.Report == nil {
		r.Report = map[string]string{}
	}
	r.Report[k] = v
}

func (r *Result) finish() {
	r.Verdict = StatusAffirming
	for _, c := range r.Claims {
		if c.Status.rank() > r.Verdict.rank() {
			r.Verdict = c.Status
		}
	}
	r.Attested = Attested(r.Platform) && r.Verdict != StatusContraindicated
}

// Claim returns the named claim, or nil.
func (r *Result) Claim(name string) *Claim {
	for i := range r.Claims {
		if r.Claims[i].Name == name {
			return &r.Claims[i]
		}
	}
	return nil
}

// Failure returns the most fundamental failure class among contraindicated
// claims (evidence before binding before reference values), or "".
func (r *Result) Failure() Failure {
	var got Failure
	for _, want := range []Failure{FailEvidence, FailBinding, FailRefValue} {
		for _, c := range r.Claims {
			if c.Status == StatusContraindicated && c.Failure == want {
				return want
			}
		}
	}
	return got
}

// Err returns nil unless the verdict is contraindicated; then a *VerifyError
// naming the failed claims.
func (r *Result) Err() error {
	if r.Verdict != StatusContraindicated {
		return nil
	}
	e := &VerifyError{Failure: r.Failure()}
	for _, c := range r.Claims {
		if c.Status == StatusContraindicated {
			e.Claims = append(e.Claims, c)
		}
	}
	return e
}

// VerifyError is a contraindicated verdict.
type VerifyError struct {
	Failure Failure
	Claims  []Claim
}

func (e *VerifyError) Error() string {
	parts := make([]string, len(e.Claims))
	for i, c := range e.Claims {
		parts[i] = c.Name + ": " + c.Reason
	}
	return "evidence rejected: " + strings.Join(parts, "; ")
}

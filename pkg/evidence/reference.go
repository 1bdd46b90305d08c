package evidence

import (
	"errors"
	"fmt"
)

// ReferenceValues are what an auditor expects of the platform, read from a
// JSON file. A value that is absent leaves its check a warning naming what
// was not compared ("not checked"), and a claim is affirming only when every
// value it covers was compared: a TDX measurement needs MRTD and all four
// RTMRs. Debug-enabled guests are rejected whatever the file says.
//
//	{
//	  "sev-snp": {
//	    "measurements": ["<96 hex>", ...],          // any of these launch measurements
//	    "host_data": "<64 hex>",                    // exact HOST_DATA
//	    "minimum_tcb": {"bootloader": 3, "tee": 0, "snp": 8, "microcode": 115},
//	    "minimum_guest_svn": 1,                     // 0 (the default) compares nothing
//	    "allow_smt": true,                          // default true
//	    "allow_migrate_ma": false,                  // default false
//	    "vmpl": 0                                   // exact VMPL, if given
//	  },
//	  "tdx": {
//	    "mr_td": ["<96 hex>", ...],                 // any of these MRTDs
//	    "rtmrs": ["<96 hex>", "", "<96 hex>", ""],  // RTMR0..3, "" = not checked (not all "")
//	    "mr_config_id": "<96 hex>",
//	    "mr_seam": ["<96 hex>", ...],
//	    "td_attributes": "<16 hex>",                // exact TDATTRIBUTES
//	    "xfam": "<16 hex>",
//	    "minimum_tee_tcb_svn": "<32 hex>"           // component-wise minimum
//	  }
//	}
type ReferenceValues struct {
	SEVSNP *SNPReference `json:"sev-snp,omitempty"`
	TDX    *TDXReference `json:"tdx,omitempty"`
}

// SNPReference holds SEV-SNP reference values.
type SNPReference struct {
	Measurements    []HexBytes `json:"measurements,omitempty"`
	HostData        HexBytes   `json:"host_data,omitempty"`
	MinimumTCB      *SNPTCB    `json:"minimum_tcb,omitempty"`
	MinimumGuestSVN uint32     `json:"minimum_guest_svn,omitempty"`
	AllowSMT        *bool      `json:"allow_smt,omitempty"`
	AllowMigrateMA  bool       `json:"allow_migrate_ma,omitempty"`
	VMPL            *uint32    `json:"vmpl,omitempty"`
}

// SNPTCB is a minimum TCB by component security patch level.
type SNPTCB struct {
	Bootloader uint8 `json:"bootloader"`
	TEE        uint8 `json:"tee"`
	SNP        uint8 `json:"snp"`
	Microcode  uint8 `json:"microcode"`
}

// TDXReference holds TDX reference values.
type TDXReference struct {
	MRTD             []HexBytes `json:"mr_td,omitempty"`
	RTMRs            []HexBytes `json:"rtmrs,omitempty"`
	MRConfigID       HexBytes   `json:"mr_config_id,omitempty"`
	MRSeam           []HexBytes `json:"mr_seam,omitempty"`
	TDAttributes     HexBytes   `json:"td_attributes,omitempty"`
	XFAM             HexBytes   `json:"xfam,omitempty"`
	MinimumTEETCBSVN HexBytes   `json:"minimum_tee_tcb_svn,omitempty"`
}

// ParseReferenceValues reads reference values strictly: unknown, duplicate
// or differently capitalised member names, wrong lengths and trailing data
// are errors.
func ParseReferenceValues(data []byte) (*ReferenceValues, error) {
	var rv ReferenceValues
	if err := decodeStrict(data, &rv); err != nil {
		return nil, fmt.Errorf("reference values: %s", jsonErr(data, err))
	}
	if rv.SEVSNP == nil && rv.TDX == nil {
		return nil, fmt.Errorf(`reference values: neither a "sev-snp" nor a "tdx" section`)
	}
	// A member given but empty ("measurements": [], "host_data": "") would
	// silently leave its check undone: a script that wrote an empty
	// variable must not turn a pinned measurement into "not checked".
	empty := func(name string, present bool) error {
		if present {
			return fmt.Errorf("reference values: %s is empty: give a value, or leave the member out to skip the check", name)
		}
		return nil
	}
	if s := rv.SEVSNP; s != nil {
		if err := errors.Join(empty("sev-snp.measurements", s.Measurements != nil && len(s.Measurements) == 0),
			empty("sev-snp.host_data", s.HostData != nil && len(s.HostData) == 0)); err != nil {
			return nil, err
		}
	}
	if t := rv.TDX; t != nil {
		for _, m := range []struct {
			name    string
			present bool
		}{
			{"tdx.mr_td", t.MRTD != nil && len(t.MRTD) == 0},
			{"tdx.mr_seam", t.MRSeam != nil && len(t.MRSeam) == 0},
			{"tdx.rtmrs", t.RTMRs != nil && len(t.RTMRs) == 0},
			{"tdx.mr_config_id", t.MRConfigID != nil && len(t.MRConfigID) == 0},
			{"tdx.td_attributes", t.TDAttributes != nil && len(t.TDAttributes) == 0},
			{"tdx.xfam", t.XFAM != nil && len(t.XFAM) == 0},
			{"tdx.minimum_tee_tcb_svn", t.MinimumTEETCBSVN != nil && len(t.MinimumTEETCBSVN) == 0},
		} {
			if err := empty(m.name, m.present); err != nil {
				return nil, err
			}
		}
	}
	if s := rv.SEVSNP; s != nil {
		for i, m := range s.Measurements {
			if len(m) != 48 {
				return nil, fmt.Errorf("reference values: sev-snp.measurements[%d] is %d bytes, want 48", i, len(m))
			}
		}
		if len(s.HostData) != 0 && len(s.HostData) != 32 {
			return nil, fmt.Errorf("reference values: sev-snp.host_data is %d bytes, want 32", len(s.HostData))
		}
	}
	if t := rv.TDX; t != nil {
		if err := t.checkSizes(); err != nil {
			return nil, err
		}
	}
	return &rv, nil
}

// checkSizes checks the size of every value t gives.
func (t *TDXReference) checkSizes() error {
	for name, list := range map[string][]HexBytes{"mr_td": t.MRTD, "mr_seam": t.MRSeam} {
		for i, m := range list {
			if len(m) != 48 {
				return fmt.Errorf("reference values: tdx.%s[%d] is %d bytes, want 48", name, i, len(m))
			}
		}
	}
	if len(t.RTMRs) > 4 {
		return fmt.Errorf("reference values: tdx.rtmrs has %d entries, at most 4", len(t.RTMRs))
	}
	given := 0
	for i, m := range t.RTMRs {
		if len(m) != 0 && len(m) != 48 {
			return fmt.Errorf("reference values: tdx.rtmrs[%d] is %d bytes, want 48 (or \"\" to skip)", i, len(m))
		}
		if len(m) != 0 {
			given++
		}
	}
	// "" skips one RTMR; a list of nothing but "" skips them all, which
	// is an empty member like those ParseReferenceValues refuses.
	if len(t.RTMRs) > 0 && given == 0 {
		return fmt.Errorf(`reference values: tdx.rtmrs has only "" entries, which check nothing: give at least one RTMR, or leave the member out to skip the check`)
	}
	for name, v := range map[string]struct {
		b    HexBytes
		size int
	}{"mr_config_id": {t.MRConfigID, 48}, "td_attributes": {t.TDAttributes, 8}, "xfam": {t.XFAM, 8}, "minimum_tee_tcb_svn": {t.MinimumTEETCBSVN, 16}} {
		if len(v.b) != 0 && len(v.b) != v.size {
			return fmt.Errorf("reference values: tdx.%s is %d bytes, want %d", name, len(v.b), v.size)
		}
	}
	return nil
}

// ReadReferenceFile reads reference values from a file.
func ReadReferenceFile(path string) (*ReferenceValues, error) {
	data, err := readFileMax(path, MaxBundleSize, errors.New("not reference values"))
	if err != nil {
		return nil, err
	}
	rv, err := ParseReferenceValues(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rv, nil
}

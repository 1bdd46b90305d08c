package evidence

// Evidence classes of an upstream and of each call, recorded in the audit log.
// A weaker class is never folded into a stronger one.
const (
	ClassSpawnMeasured   = "spawn-measured"   // the gateway digested the code it executed and it matched the pin
	ClassSpawnUnmeasured = "spawn-unmeasured" // spawned with no pin; refused unless the config allows it
	ClassTLSPinned       = "tls-pinned"       // HTTPS upstream whose SPKI matched the pinned digest
	ClassTLSCA           = "tls-ca"           // HTTPS upstream verified only by a CA chain
	ClassPlaintext       = "plaintext"        // HTTP upstream
	// ClassTunnel: reached through a machine's `cmcp connect` tunnel; what
	// the connector measured is its own claim, never the gateway's.
	ClassTunnel = "tunnel"
)

// Gateway platforms: where the gateway's key was created.
const (
	PlatformSEVSNP   = "sev-snp"  // AMD SEV-SNP confidential VM
	PlatformTDX      = "tdx"      // Intel TDX trust domain
	PlatformSoftware = "software" // no hardware: unattested, development only
)

// Classes lists the evidence classes, strongest first.
var Classes = []string{ClassSpawnMeasured, ClassTLSPinned, ClassTLSCA, ClassSpawnUnmeasured, ClassTunnel, ClassPlaintext}

// Platforms lists the gateway platforms.
var Platforms = []string{PlatformSEVSNP, PlatformTDX, PlatformSoftware}

// IsClass reports whether s is a known evidence class.
func IsClass(s string) bool {
	for _, c := range Classes {
		if c == s {
			return true
		}
	}
	return false
}

// IsPlatform reports whether s is a known gateway platform.
func IsPlatform(s string) bool {
	for _, p := range Platforms {
		if p == s {
			return true
		}
	}
	return false
}

// Attested reports whether platform is hardware-attested. Software is not.
func Attested(platform string) bool {
	return platform == PlatformSEVSNP || platform == PlatformTDX
}

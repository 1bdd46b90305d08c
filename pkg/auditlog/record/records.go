package record

import (
	"encoding/json"
	"fmt"
	"time"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Kind names a record type. It is the "kind" member of every line.
type Kind string

// Record kinds. The writer itself writes genesis, segment, checkpoint,
// recovery and seal; callers of Append write the others.
const (
	KindGenesis    Kind = "genesis"           // first record of an epoch: who, what, which key, evidence
	KindSegment    Kind = "segment"           // first record of every segment file after the first
	KindCheckpoint Kind = "checkpoint"        // in-band signed checkpoint (C2SP signed note)
	KindRecovery   Kind = "recovery"          // what was cut from a crashed predecessor epoch
	KindSeal       Kind = "seal"              // clean shutdown; followed by the final checkpoint
	KindSpawn      Kind = "spawn"             // a stdio upstream process was measured and started (or refused)
	KindUpstream   Kind = "upstream"          // an upstream connected, failed or went away
	KindDrift      Kind = "drift"             // a tool definition differs from its pin
	KindSession    Kind = "session"           // an agent session started or ended
	KindCall       Kind = "call"              // one tools/call request and its policy decision
	KindAccess     Kind = "access"            // one resources/read, resources/subscribe, prompts/get or completion/complete request and its policy decision
	KindResult     Kind = "result"            // the outcome of a forwarded call
	KindStderr     Kind = "stderr"            // byte counts of an upstream's stderr (never the bytes)
	KindPolicy     Kind = "policy"            // a policy bundle was loaded, reloaded or rejected
	KindAdmin      Kind = "admin"             // an operator action: kill switch, forced checkpoint
	KindCredential Kind = "credential_minted" // an upstream credential was minted for an identity (never the credential)
	KindMachine    Kind = "machine"           // a tunnel machine registered, was refused, or went away (never its token)
)

// writerKinds are written only by the Writer itself.
var writerKinds = map[Kind]bool{KindGenesis: true, KindSegment: true, KindCheckpoint: true, KindRecovery: true, KindSeal: true}

// IsWriterKind reports whether records of kind k are written only by the
// log's writer itself (genesis, segment, checkpoint, recovery, seal), never
// by a caller of Append.
func IsWriterKind(k Kind) bool { return writerKinds[k] }

// Record is one typed record body. Every type below implements it.
type Record interface {
	Kind() Kind
}

// Durability modes, named in the genesis record.
const (
	DurabilityStrict   = "strict"   // one write + fdatasync per record
	DurabilityGroup    = "group"    // group commit: one write + fdatasync per batch; Append waits for it
	DurabilityInterval = "interval" // fdatasync at most every Interval; Append returns after write(2)
)

// Decisions and outcomes used in call and result records.
const (
	DecisionAllow = "allow"
	DecisionDeny  = "deny"

	OutcomeForwarded = "forwarded" // call: sent to the upstream
	OutcomeRefused   = "refused"   // call: not sent (denied, kill switch, drift, fault before forwarding)

	ResultOK            = "ok"             // result: the upstream answered without isError
	ResultIsError       = "is_error"       // result: the upstream answered with isError: true
	ResultUpstreamError = "upstream_error" // result: the upstream answered with a JSON-RPC error or died
	ResultGatewayFault  = "gateway_fault"  // result: the gateway failed after forwarding
	ResultCancelled     = "cancelled"      // result: the agent cancelled the call, or its session's end cut it (error_code and reason say so)
)

// Commitment commits to a payload (tool arguments or a result) without
// revealing it: MAC = HMAC-SHA256(k_ID, "cmcp/audit/payload/v1\x00" || payload)
// where k_ID is derived from the epoch's commitment secret (see FORMAT.md).
// The zero Commitment means "no payload".
type Commitment struct {
	ID   int64  `json:"id,string"`    // commitment number within the epoch (derives the key)
	Size int64  `json:"bytes,string"` // payload length in bytes
	MAC  []byte `json:"hmac"`         // 32 bytes, base64 (standard, padded) in JSON
}

// IsZero reports whether c commits to nothing.
func (c Commitment) IsZero() bool { return len(c.MAC) == 0 }

// String formats c as "hmac-sha256:<id>:<bytes>:<hex>".
func (c Commitment) String() string {
	if c.IsZero() {
		return ""
	}
	return fmt.Sprintf("hmac-sha256:%d:%d:%x", c.ID, c.Size, c.MAC)
}

// GatewayInfo identifies the gateway build that wrote an epoch.
type GatewayInfo struct {
	Version  string        `json:"version"`
	Commit   string        `json:"commit,omitzero"`
	Binary   digest.Digest `json:"binary,omitzero"`   // digest of the running executable
	Platform string        `json:"platform,omitzero"` // sev-snp, tdx or software
}

// CommitmentInfo says how payload commitments in this epoch can be opened.
type CommitmentInfo struct {
	Scheme string `json:"scheme"` // "hmac-sha256/v1"
	// SealedSecret is the 32-byte epoch commitment secret encrypted with age
	// to Recipients (binary age format, base64). Empty: nobody can open the
	// commitments (pure hiding).
	SealedSecret []byte   `json:"sealed_secret,omitzero"`
	Recipients   []string `json:"recipients,omitzero"` // age recipients of the secret and the vault
	Vault        string   `json:"vault,omitzero"`      // vault file name in the epoch directory, if any
}

// Predecessor describes the previous epoch as the writer found it at Open.
type Predecessor struct {
	Epoch  int    `json:"epoch,string"`
	Origin string `json:"origin"`
	Size   int64  `json:"size,string"` // records in the epoch after recovery
	Root   []byte `json:"root"`        // RFC 6962 tree hash over those records
	Sealed bool   `json:"sealed"`      // it ended with a seal and a final checkpoint
}

// Genesis is the first record of an epoch.
type Genesis struct {
	Origin           string          `json:"origin"` // checkpoint origin = note key name
	Epoch            int             `json:"epoch,string"`
	Key              string          `json:"key"` // note verifier key: origin+hash+base64(0x01||pub)
	Created          time.Time       `json:"created"`
	Durability       string          `json:"durability"`
	IntervalMillis   int64           `json:"interval_ms,string,omitzero"`
	CheckpointEvery  int64           `json:"checkpoint_every,string"`
	CheckpointMillis int64           `json:"checkpoint_ms,string"`
	SegmentBytes     int64           `json:"segment_bytes,string"`
	Gateway          GatewayInfo     `json:"gateway"`
	ConfigDigest     digest.Digest   `json:"config_digest,omitzero"`
	PolicyDigest     digest.Digest   `json:"policy_digest,omitzero"`
	CatalogDigest    digest.Digest   `json:"catalog_digest,omitzero"`
	PolicyMode       string          `json:"policy_mode,omitzero"`
	Commitments      CommitmentInfo  `json:"commitments"`
	Predecessor      *Predecessor    `json:"predecessor,omitzero"`
	Log              *LogInfo        `json:"log,omitzero"`       // the stable log identity (FORMAT.md section 11)
	Statement        digest.Digest   `json:"statement,omitzero"` // digest of this body without statement and evidence
	Evidence         json.RawMessage `json:"evidence,omitzero"`  // attestation evidence (opaque; pkg/evidence)
	Extra            json.RawMessage `json:"extra,omitzero"`     // deployment-specific facts (opaque, canonical JSON)
}

// Segment is the first record of every segment file after the first one. It
// carries what is needed to verify the segment on its own.
type Segment struct {
	Number     int      `json:"number,string"`
	FirstIndex int64    `json:"first_index,string"` // index of this record
	PrevFile   string   `json:"prev_file"`
	PrevSHA256 []byte   `json:"prev_sha256"` // SHA-256 of the whole previous segment file
	Checkpoint string   `json:"checkpoint"`  // the signed note that closed the previous segment
	Frontier   [][]byte `json:"frontier"`    // RFC 6962 compact range of [0, FirstIndex), largest subtree first
}

// CheckpointRecord holds an in-band signed checkpoint for the records before it.
type CheckpointRecord struct {
	Note string `json:"note"` // C2SP signed note: origin, size, base64 root, blank line, signatures
}

// Recovery records what the writer cut from a crashed predecessor epoch.
type Recovery struct {
	Epoch         int    `json:"epoch,string"`
	Origin        string `json:"origin"`
	File          string `json:"file"`                 // segment file that was cut
	Offset        int64  `json:"offset,string"`        // where the cut starts
	DroppedBytes  int64  `json:"dropped_bytes,string"` // bytes removed
	DroppedSHA256 []byte `json:"dropped_sha256"`       // SHA-256 of the removed bytes
	SavedAs       string `json:"saved_as,omitzero"`    // file (in that epoch dir) keeping the removed bytes
	Reason        string `json:"reason"`
	Records       int64  `json:"records,string"`  // records kept in that epoch
	Unsealed      int64  `json:"unsealed,string"` // kept records after its last checkpoint
	Root          []byte `json:"root"`            // tree hash over the kept records
}

// Seal marks a clean shutdown. The final checkpoint follows it.
type Seal struct {
	Reason  string `json:"reason"`
	Records int64  `json:"records,string"` // records before this one
}

// Spawn records a stdio upstream the gateway measured and started, or refused.
type Spawn struct {
	Upstream      string        `json:"upstream"`
	Session       string        `json:"session,omitzero"` // empty for a shared child
	Shared        bool          `json:"shared,omitzero"`
	Path          string        `json:"path"` // resolved executable
	MeasureTarget string        `json:"measure_target,omitzero"`
	Digest        digest.Digest `json:"digest,omitzero"` // measured digest
	Pin           digest.Digest `json:"pin,omitzero"`    // configured pin
	ArgvDigest    digest.Digest `json:"argv_digest,omitzero"`
	// EnvNames are the names of the child's environment variables, in the
	// order it got them; Env commits to the environment itself (the
	// payload: every NAME=VALUE followed by a NUL byte, as
	// /proc/<pid>/environ shows it), since values may be secrets.
	EnvNames      []string   `json:"env_names,omitzero"`
	Env           Commitment `json:"env,omitzero"`
	EvidenceClass string     `json:"evidence_class"`
	PID           int64      `json:"pid,string,omitzero"`
	Outcome       string     `json:"outcome"` // started, refused, exited
	Reason        string     `json:"reason,omitzero"`
	ExitCode      int64      `json:"exit_code,string,omitzero"`
	Signal        string     `json:"signal,omitzero"`
}

// Upstream records an upstream connection event.
type Upstream struct {
	Name          string        `json:"name"`
	Transport     string        `json:"transport"` // stdio, http
	Endpoint      string        `json:"endpoint,omitzero"`
	EvidenceClass string        `json:"evidence_class"`
	SPKI          digest.Digest `json:"spki,omitzero"`
	ServerName    string        `json:"server_name,omitzero"`
	ServerVersion string        `json:"server_version,omitzero"`
	Tools         int64         `json:"tools,string,omitzero"`
	Session       string        `json:"session,omitzero"`
	Event         string        `json:"event"` // connected, disconnected, failed
	Reason        string        `json:"reason,omitzero"`
}

// Drift records a tool definition that differs from its pin.
type Drift struct {
	Upstream string        `json:"upstream"`
	Tool     string        `json:"tool"`
	Change   string        `json:"change"` // changed, new, removed
	Pin      digest.Digest `json:"pin,omitzero"`
	Observed digest.Digest `json:"observed,omitzero"`
	Action   string        `json:"action"` // refused, flagged
	Session  string        `json:"session,omitzero"`
}

// Session records an agent session starting or ending.
type Session struct {
	ID            string `json:"id"`
	Event         string `json:"event"` // start, end
	Agent         string `json:"agent"`
	Front         string `json:"front,omitzero"` // http, stdio
	ClientName    string `json:"client_name,omitzero"`
	ClientVersion string `json:"client_version,omitzero"`
	Protocol      string `json:"protocol,omitzero"`
	Reason        string `json:"reason,omitzero"`
	// Issuer, TokenID and Groups are set when an OAuth access token
	// identified the agent (server.oauth): the token's iss and jti claims
	// and the groups its groups claim named. Never the token itself. A
	// "token" event records a later token of the same identity on the
	// session (a refreshed one).
	Issuer  string   `json:"issuer,omitzero"`
	TokenID string   `json:"token_id,omitzero"`
	Groups  []string `json:"groups,omitzero"`
}

// Call records one tools/call request. It is made durable before the call
// is forwarded; a refused call is recorded too.
type Call struct {
	Session       string          `json:"session"`
	Agent         string          `json:"agent"`
	RequestID     json.RawMessage `json:"request_id,omitzero"` // the JSON-RPC id as sent
	Tool          string          `json:"tool"`                // exposed name
	Upstream      string          `json:"upstream"`
	UpstreamTool  string          `json:"upstream_tool,omitzero"`
	EvidenceClass string          `json:"evidence_class"`
	// Machine is the machine a tunnel upstream's call was routed to (the
	// connector's machine id), or "" for other upstreams.
	Machine      string        `json:"machine,omitzero"`
	Args         Commitment    `json:"args,omitzero"`
	Decision     string        `json:"decision"` // allow, deny
	PolicyIDs    []string      `json:"policy_ids,omitzero"`
	PolicyMode   string        `json:"policy_mode"` // enforcing, advisory, silent
	PolicyBundle digest.Digest `json:"policy_bundle,omitzero"`
	Outcome      string        `json:"outcome"` // forwarded, refused
	Reason       string        `json:"reason,omitzero"`
	// PolicyInput is what the policy decision used beyond the fields above,
	// so that replay rebuilds the exact Cedar request. Absent when no policy
	// decided the call (mode "none", or a call refused before the decision).
	PolicyInput *PolicyInput `json:"policy_input,omitzero"`
}

// PolicyInput is the part of a Cedar request that a call record does not
// otherwise hold (internal/policy documents the entity model).
type PolicyInput struct {
	Groups        []string  `json:"groups,omitzero"`      // the agent's groups (Group parents)
	EvidenceClass string    `json:"evidence_class"`       // the upstream's class the decision saw
	Hints         ToolHints `json:"hints"`                // the tool's annotations, MCP defaults applied
	Machine       string    `json:"machine,omitzero"`     // the tunnel machine the call was routed to (context.machine)
	SessionCalls  int64     `json:"session_calls,string"` // calls of the session decided before this one
	ToolsUsed     []string  `json:"tools_used,omitzero"`  // tools the session's earlier calls were let through to
	Time          time.Time `json:"time"`                 // decision time (milliseconds)
	Errors        []string  `json:"errors,omitzero"`      // evaluation errors
}

// ToolHints are MCP tool annotations as the policy saw them.
type ToolHints struct {
	ReadOnly    bool `json:"readOnlyHint"`
	Destructive bool `json:"destructiveHint"`
	Idempotent  bool `json:"idempotentHint"`
	OpenWorld   bool `json:"openWorldHint"`
}

// Access records one request that reads an upstream's resources or prompts
// (policy actions read_resource and get_prompt): resources/read,
// resources/subscribe, prompts/get, completion/complete. Like a call record
// it is durable before the request is forwarded, and a refused request is
// recorded too. No result record follows it.
type Access struct {
	Session       string        `json:"session"`
	Agent         string        `json:"agent"`
	Method        string        `json:"method"` // the MCP method
	Action        string        `json:"action"` // read_resource, get_prompt
	Upstream      string        `json:"upstream"`
	EvidenceClass string        `json:"evidence_class"`
	URI           Commitment    `json:"uri,omitzero"`    // read_resource: commitment to the URI (a payload: it may name a file)
	Prompt        string        `json:"prompt,omitzero"` // get_prompt: the prompt's name at its upstream
	Args          Commitment    `json:"args,omitzero"`   // commitment to the prompt's arguments, or to the completion's argument and context
	Decision      string        `json:"decision"`        // allow, deny
	PolicyIDs     []string      `json:"policy_ids,omitzero"`
	PolicyMode    string        `json:"policy_mode"` // none, enforcing, advisory, silent
	PolicyBundle  digest.Digest `json:"policy_bundle,omitzero"`
	Outcome       string        `json:"outcome"` // forwarded, refused
	Reason        string        `json:"reason,omitzero"`
	// PolicyInput is what the decision used beyond the fields above (absent
	// when no policy decided the request).
	PolicyInput *AccessInput `json:"policy_input,omitzero"`
}

// AccessInput is the part of a read_resource or get_prompt Cedar request
// that an access record does not otherwise hold.
type AccessInput struct {
	Groups        []string  `json:"groups,omitzero"`      // the agent's groups (Group parents)
	EvidenceClass string    `json:"evidence_class"`       // the upstream's class the decision saw
	SessionCalls  int64     `json:"session_calls,string"` // tools/call requests of the session decided before this one
	ToolsUsed     []string  `json:"tools_used,omitzero"`  // tools the session's earlier calls were let through to
	Time          time.Time `json:"time"`                 // decision time (milliseconds)
	Errors        []string  `json:"errors,omitzero"`      // evaluation errors
}

// Result records the outcome of a forwarded call.
type Result struct {
	Call          int64      `json:"call,string"` // index of the call record
	Session       string     `json:"session"`
	Outcome       string     `json:"outcome"` // ok, is_error, upstream_error, gateway_fault, cancelled
	Result        Commitment `json:"result,omitzero"`
	LatencyMicros int64      `json:"latency_us,string"`
	ErrorCode     int64      `json:"error_code,string,omitzero"` // JSON-RPC error code, if any
	Reason        string     `json:"reason,omitzero"`
}

// Stderr records how much an upstream wrote to stderr (never what).
type Stderr struct {
	Upstream string `json:"upstream"`
	Session  string `json:"session,omitzero"`
	Bytes    int64  `json:"bytes,string"`
	Lines    int64  `json:"lines,string"`
	Dropped  int64  `json:"dropped,string,omitzero"` // bytes dropped by the bounded buffer
}

// Policy records a policy bundle event.
type Policy struct {
	Event    string        `json:"event"` // loaded, reloaded, rejected
	Bundle   digest.Digest `json:"bundle,omitzero"`
	Previous digest.Digest `json:"previous,omitzero"` // reloaded, rejected: the bundle in force before
	Mode     string        `json:"mode,omitzero"`
	Path     string        `json:"path,omitzero"`
	Policies int64         `json:"policies,string,omitzero"`
	Reason   string        `json:"reason,omitzero"`
}

// Admin records an operator action on the admin endpoint.
type Admin struct {
	Action string `json:"action"` // kill_switch_on, kill_switch_off, checkpoint, tokens_reloaded, upstream_credentials_reloaded, reload_rejected
	Actor  string `json:"actor,omitzero"`
	Reason string `json:"reason,omitzero"`
}

// CredentialMinted says who got a new upstream credential, when (the
// record's ts), from which source, until when and which one: a keyed
// fingerprint, never the credential itself.
type CredentialMinted struct {
	Upstream    string `json:"upstream"`
	Identity    string `json:"identity"`
	Source      string `json:"source"`           // exec, client_credentials, token_exchange, authorization_code
	Reason      string `json:"reason"`           // first, expiring, refused
	Expires     string `json:"expires,omitzero"` // RFC 3339 UTC; absent when the source did not say
	Fingerprint string `json:"fingerprint"`      // hmac-sha256:<24 hex>, keyed per gateway run
	Session     string `json:"session,omitzero"` // the session whose call minted it, if known
}

// Machine events.
const (
	MachineRegistered = "registered" // admitted: its calls may be routed to it
	MachineRefused    = "refused"    // its registration was refused (code and reason say why)
	MachineGone       = "gone"       // its tunnel ended (reason says why, connected_ms how long it had been registered)
)

// Machine records a machine of a tunnel upstream (a `cmcp connect`
// connector) registering, being refused, or going away. The server and
// host facts are what the connector claimed (evidence class "tunnel"),
// never the gateway's own measurement. The machine token is never
// recorded: token_id names which of the upstream's configured tokens
// matched.
type Machine struct {
	Event       string         `json:"event"`                   // registered, refused, gone
	Upstream    string         `json:"upstream,omitzero"`       // absent: refused before it said
	Machine     string         `json:"machine,omitzero"`        // the machine id it registered (or claimed)
	Name        string         `json:"name,omitzero"`           // its name for people
	Remote      string         `json:"remote,omitzero"`         // the address the tunnel came from
	Version     string         `json:"version,omitzero"`        // the connector's cmcp version
	TokenID     string         `json:"token_id,omitzero"`       // "tokens[N]": the upstream's configured token that matched
	Attested    bool           `json:"attested,omitzero"`       // the connector verified the gateway's evidence before registering
	Class       string         `json:"evidence_class,omitzero"` // "tunnel": the facts below are the connector's claims
	Server      *MachineServer `json:"server,omitzero"`
	Host        *MachineHost   `json:"host,omitzero"`
	Code        string         `json:"code,omitzero"`                // refused: the refusal code (unauthorized, duplicate, tools, full, bad_frame)
	Reason      string         `json:"reason,omitzero"`              // refused, gone: why
	ConnectedMS int64          `json:"connected_ms,string,omitzero"` // gone: milliseconds from its registration to its end
	// Suppressed counts the refusals not recorded since the previous
	// refused record: refusals are recorded at a bounded rate, so that
	// whoever can reach the tunnel endpoint cannot fill the log.
	Suppressed int64 `json:"suppressed,string,omitzero"`
}

// MachineServer is the MCP server a connector says it serves.
type MachineServer struct {
	Kind    string `json:"kind"`             // stdio, http
	Command string `json:"command,omitzero"` // the resolved executable, or the URL
	Pin     string `json:"pin,omitzero"`     // the pin the connector checked
	Digest  string `json:"digest,omitzero"`  // the digest it measured
	Class   string `json:"class,omitzero"`   // the evidence class it spawned it with
}

// MachineHost are the host facts a connector sent at registration.
type MachineHost struct {
	Hostname string `json:"hostname,omitzero"`
	OS       string `json:"os,omitzero"`
	Arch     string `json:"arch,omitzero"`
	CPUs     int64  `json:"cpus,string,omitzero"`
}

func (*Genesis) Kind() Kind          { return KindGenesis }
func (*Segment) Kind() Kind          { return KindSegment }
func (*CheckpointRecord) Kind() Kind { return KindCheckpoint }
func (*Recovery) Kind() Kind         { return KindRecovery }
func (*Seal) Kind() Kind             { return KindSeal }
func (*Spawn) Kind() Kind            { return KindSpawn }
func (*Upstream) Kind() Kind         { return KindUpstream }
func (*Drift) Kind() Kind            { return KindDrift }
func (*Session) Kind() Kind          { return KindSession }
func (*Call) Kind() Kind             { return KindCall }
func (*Access) Kind() Kind           { return KindAccess }
func (*Result) Kind() Kind           { return KindResult }
func (*Stderr) Kind() Kind           { return KindStderr }
func (*Policy) Kind() Kind           { return KindPolicy }
func (*Admin) Kind() Kind            { return KindAdmin }
func (*CredentialMinted) Kind() Kind { return KindCredential }
func (*Machine) Kind() Kind          { return KindMachine }

// newRecord returns an empty record of kind k.
func newRecord(k Kind) (Record, error) {
	switch k {
	case KindGenesis:
		return new(Genesis), nil
	case KindSegment:
		return new(Segment), nil
	case KindCheckpoint:
		return new(CheckpointRecord), nil
	case KindRecovery:
		return new(Recovery), nil
	case KindSeal:
		return new(Seal), nil
	case KindSpawn:
		return new(Spawn), nil
	case KindUpstream:
		return new(Upstream), nil
	case KindDrift:
		return new(Drift), nil
	case KindSession:
		return new(Session), nil
	case KindCall:
		return new(Call), nil
	case KindAccess:
		return new(Access), nil
	case KindResult:
		return new(Result), nil
	case KindStderr:
		return new(Stderr), nil
	case KindPolicy:
		return new(Policy), nil
	case KindAdmin:
		return new(Admin), nil
	case KindCredential:
		return new(CredentialMinted), nil
	case KindMachine:
		return new(Machine), nil
	}
	return nil, fmt.Errorf("unknown record kind %q", k)
}

// DecodeBody decodes the canonical JSON body of a record of kind k into its
// typed form. Unknown members are refused.
func DecodeBody(k Kind, body []byte) (Record, error) {
	r, err := newRecord(k)
	if err != nil {
		return nil, err
	}
	if err := jsonv2.Unmarshal(body, r, jsonv2.RejectUnknownMembers(true)); err != nil {
		return nil, fmt.Errorf("%s record: %w", k, err)
	}
	return r, nil
}

// LogInfo is the genesis member that binds an epoch to the log identity:
// the log origin and key, and the log tree of every earlier epoch's
// records (size and compact range). The genesis statement covers it, so
// the epoch's attestation evidence binds the log key too.
type LogInfo struct {
	Origin   string   `json:"origin"`
	Key      string   `json:"key"`         // note verifier key of the log key (name = Origin)
	Size     int64    `json:"size,string"` // records of all earlier epochs = log index of this genesis
	Frontier [][]byte `json:"frontier"`    // RFC 6962 compact range of those records, largest subtree first
}

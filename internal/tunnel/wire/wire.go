// Package wire is the protocol spoken on a cmcp tunnel: the WebSocket that
// `cmcp connect` opens from a remote machine to a gateway's tunnel
// endpoint. Every WebSocket text message is one JSON object, a Frame, whose
// "t" names its type:
//
//	connector -> gateway            gateway -> connector
//	hello      {nonce}              evidence   {bundle}        (attested connectors only, before register)
//	register   {token, machine...}  registered {heartbeat_ms}  or refused {code, reason}
//	heartbeat  {host}               open       {s}             (a gateway session wants the server)
//	opened     {s}                  msg        {s, m}
//	msg        {s, m}               close      {s, reason}
//	closed     {s, reason}
//
// A "msg" frame carries one JSON-RPC message (m, verbatim) of one gateway
// session (s): one tunnel carries many gateway sessions, and the connector
// serves each with its own connection to the MCP server (for a stdio server,
// its own measured child). The token travels inside the register frame, not
// in the HTTP upgrade, so that a connector that requires attestation reveals
// it only to a gateway whose evidence it verified first.
//
// Decode is strict: unknown fields, a frame over MaxFrame, a session id,
// machine id or text field out of its bounds, or a message that is not a
// JSON object are refused with an error naming the field.
package wire

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

// Subprotocol is the WebSocket subprotocol of this version of the protocol.
const Subprotocol = "cmcp-tunnel.v1"

// MaxMessage bounds one JSON-RPC message carried in a msg frame: the same
// 16 MiB as one message on a stdio child's stdout.
const MaxMessage = 16 << 20

// MaxFrame bounds one WebSocket message on the tunnel (MaxMessage plus the
// envelope; an evidence bundle fits well within it).
const MaxFrame = MaxMessage + 4096

// Frame types.
const (
	THello      = "hello"
	TEvidence   = "evidence"
	TRegister   = "register"
	TRegistered = "registered"
	TRefused    = "refused"
	THeartbeat  = "heartbeat"
	TOpen       = "open"
	TOpened     = "opened"
	TMsg        = "msg"
	TClose      = "close"
	TClosed     = "closed"
)

// Refusal codes of a refused frame.
const (
	// CodeUnauthorized: the token is not one of the upstream's machine
	// tokens, or not for this machine id. Retrying with the same token is
	// pointless: a connector waits its longest backoff before it tries
	// again.
	CodeUnauthorized = "unauthorized"
	// CodeDuplicate: another connector holds the machine id.
	CodeDuplicate = "duplicate"
	// CodeUnknownUpstream: no tunnel upstream of that name.
	CodeUnknownUpstream = "unknown_upstream"
	// CodeTools: the machine's server publishes other tools than the
	// upstream's pins or its other machines.
	CodeTools = "tools"
	// CodeBadFrame: the connector sent something the protocol does not allow.
	CodeBadFrame = "bad_frame"
	// CodeFull: the gateway holds as many machines as it may.
	CodeFull = "full"
	// CodeUnavailable: the gateway could not take the machine now (its
	// audit log could not record the registration); try again later.
	CodeUnavailable = "unavailable"
)

// Frame is one tunnel message. Only the fields of its type are set.
type Frame struct {
	T string `json:"t"`
	// S is the gateway session a frame belongs to (open, opened, msg,
	// close, closed).
	S string `json:"s,omitempty"`
	// M is the JSON-RPC message of a msg frame, verbatim.
	M json.RawMessage `json:"m,omitempty"`
	// Reason says why a session closed or a register was refused.
	Reason string `json:"reason,omitempty"`
	// Code is a refusal's code.
	Code string `json:"code,omitempty"`
	// Nonce is a hello's freshness nonce (hex in JSON).
	Nonce evidence.HexBytes `json:"nonce,omitempty"`
	// Bundle is the gateway's evidence answering a hello.
	Bundle json.RawMessage `json:"bundle,omitempty"`
	// Register is the connector's registration.
	Register *Register `json:"register,omitempty"`
	// Host are the machine's facts, in a heartbeat.
	Host *Host `json:"host,omitempty"`
	// HeartbeatMS is the heartbeat period the gateway asks for.
	HeartbeatMS int64 `json:"heartbeat_ms,omitempty"`

	// checked: M is valid JSON in the strict sense (Checked).
	checked bool
}

// Checked reports whether Decode checked the message M of a msg frame to
// be valid JSON in the strict sense (jsontext.Value(M).IsValid()). M
// shares the bytes given to Decode: a caller that never reuses them may
// decode M with rpcwire.DecodeChecked, without checking it again. Every
// msg frame EncodeMsg writes with such a message is checked.
func (f *Frame) Checked() bool { return f.checked }

// Register is what a connector says about itself.
type Register struct {
	Token     string `json:"token"`
	Upstream  string `json:"upstream"`
	MachineID string `json:"machine_id"`
	Name      string `json:"name"`
	Version   string `json:"version"`
	Server    Server `json:"server"`
	Host      Host   `json:"host"`
}

// Server describes the MCP server the connector serves, as the connector
// measured it: claims of the connector, never the gateway's measurement.
type Server struct {
	// Kind is "stdio" or "http".
	Kind string `json:"kind"`
	// Command is the resolved executable (stdio) or the URL (http).
	Command string `json:"command"`
	// Pin and Digest are the pin the connector checked and the digest it
	// measured (stdio); Class is the evidence class it spawned it with.
	Pin    string `json:"pin,omitempty"`
	Digest string `json:"digest,omitempty"`
	Class  string `json:"class"`
}

// Host are facts about the remote machine, sent at register and with each
// heartbeat.
type Host struct {
	Hostname string  `json:"hostname"`
	OS       string  `json:"os"`
	Arch     string  `json:"arch"`
	CPUs     int     `json:"cpus"`
	Load1    float64 `json:"load1"`
	Sessions int     `json:"sessions"`
}

// machineIDRe is a machine id without its bound, checked apart (a
// counted repetition compiles to one instruction per count).
var machineIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// ValidMachineID reports whether id is a machine id: 1 to 64 of
// [A-Za-z0-9._-], starting with a letter or digit.
func ValidMachineID(id string) bool { return len(id) <= 64 && machineIDRe.MatchString(id) }

// Bounds of the text fields.
const (
	maxSessionID = 128
	maxText      = 256
	maxToken     = 1024
	maxReason    = 1024
	maxBundle    = 1 << 20
)

// Decode parses one frame strictly and checks its bounds. A msg frame's M
// may share b's bytes.
func Decode(b []byte) (*Frame, error) {
	if len(b) > MaxFrame {
		return nil, fmt.Errorf("tunnel frame of %d bytes is over the limit of %d", len(b), MaxFrame)
	}
	if f, ok := decodeMsg(b); ok {
		return f, nil
	}
	return decodeSlow(b)
}

// msgPrefix starts every msg frame as EncodeMsg writes it.
const msgPrefix = `{"t":"msg","s":"`

// decodeMsg decodes a msg frame written exactly as EncodeMsg writes it
// (no escapes in the session id, no spaces): {"t":"msg","s":"ID","m":M}
// where M is one valid JSON object (RFC 8259, UTF-8, no duplicate names)
// within MaxMessage. Anything else (ok false) goes to decodeSlow, which
// accepts all this accepts: the fast path only saves the reflection and
// the copy for the frame that carries every call.
func decodeMsg(b []byte) (*Frame, bool) {
	if !bytes.HasPrefix(b, []byte(msgPrefix)) || b[len(b)-1] != '}' {
		return nil, false
	}
	rest := b[len(msgPrefix):]
	end := bytes.IndexByte(rest, '"')
	if end <= 0 || end > maxSessionID {
		return nil, false
	}
	sid := string(rest[:end])
	if !sessionIDChars(sid) {
		return nil, false
	}
	rest, ok := bytes.CutPrefix(rest[end+1:], []byte(`,"m":`))
	if !ok {
		return nil, false
	}
	m := rest[:len(rest)-1]
	if len(m) == 0 || m[0] != '{' || len(m) > MaxMessage || !jsontext.Value(m).IsValid() {
		return nil, false
	}
	return &Frame{T: TMsg, S: sid, M: json.RawMessage(m), checked: true}, true
}

// decodeSlow decodes any frame with encoding/json, strictly.
func decodeSlow(b []byte) (*Frame, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	var f Frame
	if err := d.Decode(&f); err != nil {
		return nil, fmt.Errorf("tunnel frame is not a frame object: %w", err)
	}
	if d.More() {
		return nil, errors.New("tunnel frame has data after its object")
	}
	if err := f.check(); err != nil {
		return nil, fmt.Errorf("tunnel %s frame: %w", printable(f.T), err)
	}
	return &f, nil
}

func (f *Frame) check() error {
	needS := false
	switch f.T {
	case THello:
		if len(f.Nonce) < 16 || len(f.Nonce) > evidence.MaxNonceSize {
			return fmt.Errorf("nonce is %d bytes, want 16 to %d", len(f.Nonce), evidence.MaxNonceSize)
		}
	case TEvidence:
		if len(f.Bundle) == 0 || len(f.Bundle) > maxBundle {
			return fmt.Errorf("evidence bundle is %d bytes, want 1 to %d", len(f.Bundle), maxBundle)
		}
	case TRegister:
		if f.Register == nil {
			return errors.New("no register object")
		}
		if err := f.Register.check(); err != nil {
			return err
		}
	case TRegistered, TRefused:
	case THeartbeat:
		if f.Host == nil {
			return errors.New("no host facts")
		}
		if err := f.Host.check(); err != nil {
			return err
		}
	case TOpen, TOpened, TClose, TClosed:
		needS = true
	case TMsg:
		needS = true
		if len(f.M) == 0 || f.M[0] != '{' {
			return errors.New("m is not a JSON-RPC message object")
		}
		if len(f.M) > MaxMessage {
			return fmt.Errorf("message of %d bytes is over the limit of %d", len(f.M), MaxMessage)
		}
	default:
		return errors.New("unknown frame type")
	}
	if needS && (f.S == "" || len(f.S) > maxSessionID || !sessionIDChars(f.S)) {
		return fmt.Errorf("session id must be 1 to %d of [A-Za-z0-9._:-]", maxSessionID)
	}
	if len(f.Reason) > maxReason || !utf8.ValidString(f.Reason) {
		return fmt.Errorf("reason must be valid UTF-8 of at most %d bytes", maxReason)
	}
	if len(f.Code) > maxText {
		return errors.New("code too long")
	}
	return nil
}

func (r *Register) check() error {
	if r.Token == "" || len(r.Token) > maxToken {
		return fmt.Errorf("token must be 1 to %d bytes", maxToken)
	}
	if !ValidMachineID(r.MachineID) {
		return fmt.Errorf("machine id %s is not 1 to 64 of [A-Za-z0-9._-] starting with a letter or digit", printable(r.MachineID))
	}
	for name, v := range map[string]string{"upstream": r.Upstream, "name": r.Name, "version": r.Version, "server.kind": r.Server.Kind, "server.command": r.Server.Command, "server.pin": r.Server.Pin, "server.digest": r.Server.Digest, "server.class": r.Server.Class} {
		if len(v) > maxText || !utf8.ValidString(v) || strings.ContainsFunc(v, isControl) {
			return fmt.Errorf("%s must be printable text of at most %d bytes", name, maxText)
		}
	}
	if r.Upstream == "" {
		return errors.New("no upstream name")
	}
	if r.Server.Kind != "stdio" && r.Server.Kind != "http" {
		return fmt.Errorf("server.kind %s is neither stdio nor http", printable(r.Server.Kind))
	}
	if r.Server.Digest != "" {
		if _, err := digest.Parse(r.Server.Digest); err != nil {
			return fmt.Errorf("server.digest: %w", err)
		}
	}
	return r.Host.check()
}

func (h *Host) check() error {
	for name, v := range map[string]string{"host.hostname": h.Hostname, "host.os": h.OS, "host.arch": h.Arch} {
		if len(v) > maxText || !utf8.ValidString(v) || strings.ContainsFunc(v, isControl) {
			return fmt.Errorf("%s must be printable text of at most %d bytes", name, maxText)
		}
	}
	if h.CPUs < 0 || h.CPUs > 1<<20 || h.Sessions < 0 || h.Load1 < 0 || h.Load1 > 1e9 {
		return errors.New("host facts out of range")
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) }

// sessionIDChars reports whether s is made of [A-Za-z0-9._:-].
func sessionIDChars(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

// printable quotes s for an error, cut to 64 bytes.
func printable(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return fmt.Sprintf("%q", s)
}

// Encode returns the frame's JSON.
func Encode(f *Frame) []byte {
	b, err := json.Marshal(f)
	if err != nil {
		panic("wire: encode frame: " + err.Error()) // every field marshals
	}
	return b
}

// EncodeMsg returns a msg frame for session s carrying m (a JSON-RPC
// message object, copied verbatim) without re-encoding m.
func EncodeMsg(s string, m []byte) []byte {
	sq, _ := json.Marshal(s)
	b := make([]byte, 0, len(m)+len(sq)+20)
	b = append(b, `{"t":"msg","s":`...)
	b = append(b, sq...)
	b = append(b, `,"m":`...)
	b = append(b, m...)
	b = append(b, '}')
	return b
}

// ChannelDomain separates the tunnel's channel statement from any other
// digest.
const ChannelDomain = "cmcp-tunnel-channel-v1"

// ExporterLabel is the TLS exporter label (RFC 8446 section 7.5) of the
// channel binding.
const ExporterLabel = "EXPORTER-cmcp-tunnel-channel"

// ChannelStatement is the statement a gateway binds into the evidence it
// gives a connector (evidence.ReportData's statement):
//
//	SHA-256( "cmcp-tunnel-channel-v1" || 0x00 || EKM )
//
// where EKM is 32 bytes of TLS keying material exported with
// ExporterLabel from the connection the tunnel runs on. The exporter is a
// function of that TLS session's whole handshake (both randoms, the
// certificate the server presented, the key exchange): a proxy that
// terminates TLS runs two sessions with two different exporters, so the
// evidence the gateway binds to its session does not match the one the
// connector computes on its own, and the connector refuses it.
func ChannelStatement(cs *tls.ConnectionState) (digest.Digest, error) {
	if cs == nil {
		return digest.Digest{}, errors.New("the tunnel is not on TLS: attestation needs an https:// gateway URL (the evidence is bound to the TLS channel)")
	}
	if cs.Version < tls.VersionTLS13 {
		return digest.Digest{}, errors.New("the tunnel's TLS is older than 1.3: the channel binding needs TLS 1.3")
	}
	ekm, err := cs.ExportKeyingMaterial(ExporterLabel, nil, 32)
	if err != nil {
		return digest.Digest{}, fmt.Errorf("export TLS keying material: %w", err)
	}
	return ChannelStatementOf(ekm), nil
}

// ChannelStatementOf is ChannelStatement for exported keying material ekm.
func ChannelStatementOf(ekm []byte) digest.Digest {
	h := sha256.New()
	h.Write([]byte(ChannelDomain))
	h.Write([]byte{0})
	h.Write(ekm)
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	return digest.FromSum(sum)
}

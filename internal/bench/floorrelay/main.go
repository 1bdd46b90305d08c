// Command floorrelay is the floor of a correct stdio gateway for
// BenchmarkTable ("stdio floor relay"): noprelay's hop (two goroutines,
// each parked in the poller on its own pipe, one write per line) plus the
// work that cmcp serve --stdio's properties take on every tools/call, done
// the cheapest way this repository knows, and nothing else:
//
//   - every line from the agent decoded strictly (rpcwire.DecodeFast: one
//     JSON object, valid UTF-8, no repeated member names): the decision
//     and the record must be about the call the child reads, and readers
//     disagree on an ambiguous line;
//   - a tools/call's name and arguments read from its params
//     (rpcwire.EachMember, as the gateway's fast path does): the policy
//     decides on them and the record commits to the arguments;
//   - one Cedar decision (internal/policy's engine, the same bundle and
//     groups as the benchmark's cmcp): every call is decided before it is
//     forwarded, and a refused one is answered here and not forwarded;
//   - the call record (a commitment to the arguments, the decision and its
//     policy input) appended to a pkg/auditlog log in the same durability
//     mode before the line is forwarded, and the call refused if it cannot
//     be: no call reaches the child unrecorded;
//   - the child's answer decoded strictly too and matched to its call by
//     id (a map under a lock; the agent's own ids are kept, as a relay
//     with one agent may), its result checked to be a tools/call result
//     (an object whose isError, if any, is a boolean) and committed to,
//     the line written to the agent, then the result record appended.
//
// Lines that are not tools/call requests are decoded and forwarded as
// they are. The child's stderr is the relay's.
//
//	floorrelay -policy DIR -groups ops=bench -audit DIR -durability interval COMMAND [ARG...]
package main

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

func main() {
	policyDir := flag.String("policy", "", "the Cedar bundle's directory")
	groups := flag.String("groups", "", "group=agent,agent;... (policy.groups)")
	auditDir := flag.String("audit", "", "the audit log's directory")
	durability := flag.String("durability", record.DurabilityInterval, "the audit log's durability")
	agent := flag.String("agent", "bench", "the agent's identity")
	flag.Parse()
	if flag.NArg() < 1 || *policyDir == "" || *auditDir == "" {
		fmt.Fprintln(os.Stderr, "usage: floorrelay -policy DIR -audit DIR [-groups G=A,..;..] [-durability MODE] COMMAND [ARG...]")
		os.Exit(2)
	}
	if err := run(*policyDir, *groups, *auditDir, *durability, *agent, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "floorrelay:", err)
		os.Exit(1)
	}
}

func run(policyDir, groupSpec, auditDir, durability, agent string, command []string) error {
	ctx := context.Background()
	b, err := policy.Load(ctx, policyDir, policy.LoadOptions{})
	if err != nil {
		return err
	}
	groups := map[string][]string{}
	for _, g := range strings.Split(groupSpec, ";") {
		if name, members, ok := strings.Cut(g, "="); ok {
			groups[name] = strings.Split(members, ",")
		}
	}
	eng := policy.NewEngine(b, policy.Enforcing, groups)
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	log, err := auditlog.Open(auditDir, auditlog.Options{Key: key, Durability: durability,
		Gateway: record.GatewayInfo{Version: "floorrelay", Platform: "software"}, PolicyDigest: b.Digest(), PolicyMode: string(policy.Enforcing)})
	if err != nil {
		return err
	}
	defer log.Close()

	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	r := &relay{log: log, eng: eng, agent: agent, session: "floor-1", pending: map[jsonrpc.ID]call{}}
	go func() {
		r.fromAgent(os.Stdin, in, os.Stdout)
		in.Close()
	}()
	r.fromChild(out, os.Stdout)
	return cmd.Wait()
}

type relay struct {
	log            *auditlog.Writer
	eng            *policy.Engine
	agent, session string
	wmu            sync.Mutex // one line at a time to the agent
	mu             sync.Mutex
	pending        map[jsonrpc.ID]call
}

// call is a forwarded call waiting for its answer.
type call struct {
	index int64 // its call record's
	start time.Time
}

func (r *relay) toAgent(w io.Writer, line []byte) {
	r.wmu.Lock()
	w.Write(line)
	r.wmu.Unlock()
}

// fromAgent relays the agent's lines to the child, each tools/call decided
// and recorded first.
func (r *relay) fromAgent(from io.Reader, child, agent io.Writer) {
	eachLine(from, func(line []byte) bool {
		msg, ok := rpcwire.DecodeFast(line[:len(line)-1])
		if !ok {
			r.toAgent(agent, []byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"floorrelay: not a strict JSON-RPC message"}}`+"\n"))
			return true
		}
		if req, isReq := msg.(*jsonrpc.Request); isReq && req.Method == "tools/call" && req.IsCall() {
			if e := r.admit(req); e != "" {
				b, _ := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: -32600, Message: e}})
				r.toAgent(agent, append(b, '\n'))
				return true
			}
		}
		_, err := child.Write(line)
		return err == nil
	})
}

// admit decides and records a call; it says why it is refused, or "".
func (r *relay) admit(req *jsonrpc.Request) string {
	var name string
	var args []byte
	if !rpcwire.EachMember(req.Params, func(n, v []byte) {
		switch string(n) {
		case "name":
			json.Unmarshal(v, &name)
		case "arguments":
			args = v
		}
	}) || name == "" {
		return "floorrelay: bad tools/call params"
	}
	if len(args) == 0 {
		args = []byte("{}")
	}
	start := time.Now()
	o := r.eng.DecideCall(policy.Call{Agent: r.agent, Session: r.session, Tool: name, ToolName: name, Upstream: "echo",
		EvidenceClass: "spawn-measured", Annotations: policy.DefaultAnnotations, Arguments: args})
	rec := &record.Call{Session: r.session, Agent: r.agent, Tool: name, Upstream: "echo", UpstreamTool: name, EvidenceClass: "spawn-measured",
		Args: r.log.Commit(args), Decision: o.Effect(), PolicyIDs: o.PolicyIDs, PolicyMode: string(o.Mode), PolicyBundle: o.Bundle,
		Outcome: record.OutcomeForwarded, PolicyInput: o.Input()}
	rec.RequestID, _ = json.Marshal(req.ID.Raw())
	if o.Refuse {
		rec.Outcome = record.OutcomeRefused
		r.log.Append(context.Background(), rec)
		return "floorrelay: denied by policy"
	}
	rcpt, err := r.log.Append(context.Background(), rec)
	if err != nil {
		return "floorrelay: the audit log cannot record calls: " + err.Error()
	}
	r.mu.Lock()
	r.pending[req.ID] = call{index: rcpt.Index, start: start}
	r.mu.Unlock()
	return ""
}

// fromChild relays the child's lines to the agent, each answer to a call
// committed to and recorded once written.
func (r *relay) fromChild(from io.Reader, agent io.Writer) {
	eachLine(from, func(line []byte) bool {
		msg, ok := rpcwire.DecodeFast(line[:len(line)-1])
		if !ok {
			return false // a child that writes what no strict reader takes is cut off
		}
		resp, isResp := msg.(*jsonrpc.Response)
		if !isResp {
			r.toAgent(agent, line)
			return true
		}
		r.mu.Lock()
		c, waited := r.pending[resp.ID]
		delete(r.pending, resp.ID)
		r.mu.Unlock()
		if !waited {
			r.toAgent(agent, line)
			return true
		}
		res := &record.Result{Call: c.index, Session: r.session, Outcome: record.ResultOK}
		if we, isErr := resp.Error.(*jsonrpc.Error); isErr {
			res.Outcome, res.ErrorCode, res.Reason = record.ResultUpstreamError, we.Code, we.Message
		} else {
			var isError []byte
			if len(resp.Result) == 0 || resp.Result[0] != '{' || !rpcwire.EachMember(resp.Result, func(n, v []byte) {
				if string(n) == "isError" {
					isError = v
				}
			}) {
				return false
			}
			switch string(isError) {
			case "true":
				res.Outcome = record.ResultIsError
			case "", "false", "null":
			default:
				return false
			}
			res.Result = r.log.Commit(resp.Result)
		}
		r.toAgent(agent, line)
		res.LatencyMicros = time.Since(c.start).Microseconds()
		_, err := r.log.Append(context.Background(), res)
		return err == nil
	})
}

// eachLine calls f with each whole line read from r (its '\n' included)
// until f returns false or r ends.
func eachLine(r io.Reader, f func([]byte) bool) {
	br := bufio.NewReaderSize(r, 64<<10)
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if len(line) > 0 && err == nil && !f(line) {
			return
		}
		line = line[:0]
		if err != nil {
			return
		}
	}
}

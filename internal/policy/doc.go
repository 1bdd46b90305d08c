// Package policy decides tool calls with Cedar (github.com/cedar-policy/cedar-go).
//
// # Bundles
//
// A bundle is a directory holding one .cedarschema at its top and any number
// of .cedar files (recursively, read in path order). Its digest is the tree
// digest of the whole directory (pkg/digest.Tree: every file counts, not only
// the policies), pinned in the config as policy.expect and recorded in the
// audit log's genesis record. Load refuses a bundle, naming the file, line and
// reason, when:
//
//   - a policy does not parse;
//   - a policy does not validate against the schema (cedar-go's validator,
//     x/exp/schema/validate, strict mode: unknown entity types, attributes
//     or actions, optional attributes read without `has`, type errors);
//   - the schema does not describe the entity model below (a sample of every
//     entity and of both requests is validated against it), so a policy can
//     never validate against a model the gateway does not build;
//   - two policies share an id;
//   - the digest does not match the pin.
//
// A policy's id is its @id("...") annotation, or else "<file>:<line>:<col>".
//
// # Entity model
//
//	principal  Agent::"<identity>"          parents: Group::"<g>" for each group of policy.groups that lists the agent
//	action     Action::"call_tool"          a tools/call request
//	           Action::"list_tools"         one tool's entry in a tools/list response
//	resource   Tool::"<upstream>__<tool>"   parent: Upstream::"<upstream>"
//	             .name            String    the tool's name at its upstream
//	             .upstream        String
//	             .evidence_class  String    spawn-measured, spawn-unmeasured, tls-pinned, tls-ca, plaintext
//	             .annotations     { readOnlyHint, destructiveHint, idempotentHint, openWorldHint: Bool }
//	                                        MCP defaults for undeclared hints: false, true, false, true
//	           Upstream::"<name>"
//	             .evidence_class  String
//	context    .arguments   record          call_tool only: params.arguments (see ArgumentsRecord)
//	           .session     { id: String, calls: Long, tools_used: Set<String> }
//	           .now         datetime        decision time, millisecond precision
//
// The schema every bundle starts from is examples/policy/schema.cedarschema;
// a bundle declares in its CallArgs type the arguments its policies read.
//
// Examples:
//
//	// an allow-list by agent and group
//	permit (principal == Agent::"alice", action, resource in Upstream::"git");
//	permit (principal in Group::"ops", action, resource);
//
//	// a deny on an argument value
//	forbid (principal, action == Action::"call_tool", resource in Upstream::"fs")
//	when { context.arguments has path && !(context.arguments.path like "/srv/data/*") };
//
//	// no code the gateway did not measure
//	forbid (principal, action, resource) when { resource.evidence_class == "spawn-unmeasured" };
//
//	// a read-only agent
//	permit (principal == Agent::"reporter", action, resource)
//	when { resource.annotations.readOnlyHint && !resource.annotations.destructiveHint };
//
// # Decisions
//
// Decide gives allow or deny, the determining policy ids (the permits that
// allowed, or the forbids that denied; none for a default deny), evaluation
// errors, and a one-line reason. A forbid whose evaluation errors counts as
// matching (Cedar alone would skip it, and a malformed argument would then
// slip past the rule meant to stop it). Arguments past MaxArgumentBytes,
// MaxArgumentDepth or MaxArgumentValues, or that are not a JSON object, deny
// the call with an error naming the limit. A Request fully determines its
// Decision: replay rebuilds the Request from the audit log and must get the
// recorded decision.
//
// Modes (enforcing, advisory, silent) say what the gateway does with a deny;
// they do not change the decision.
package policy

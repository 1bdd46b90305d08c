// Package policy decides tool calls, and reads of resources and prompts,
// with Cedar (github.com/cedar-policy/cedar-go).
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
//     entity and of a request of every action is validated against it), so a policy can
//     never validate against a model the gateway does not build;
//   - the schema declares an argument of a type no JSON argument converts
//     to (ipaddr, datetime, duration, an entity type), which no call could
//     send;
//   - a policy tests with has a member of the arguments the schema does not
//     declare: the validator accepts it as always false, and it is, since
//     such members are left out of context.arguments (see argtypes.go);
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
//	           Action::"read_resource"      resources/read, resources/subscribe, completion/complete
//	                                        on a ref/resource; one entry of resources/list or
//	                                        resources/templates/list
//	           Action::"get_prompt"         prompts/get, completion/complete on a ref/prompt; one
//	                                        entry of prompts/list
//	resource   Tool::"<upstream>__<tool>"   call_tool, list_tools; parent: Upstream::"<upstream>"
//	             .name            String    the tool's name at its upstream
//	             .upstream        String
//	             .evidence_class  String    spawn-measured, spawn-unmeasured, tls-pinned, tls-ca, plaintext
//	             .annotations     { readOnlyHint, destructiveHint, idempotentHint, openWorldHint: Bool }
//	                                        MCP defaults for undeclared hints: false, true, false, true
//	           Upstream::"<name>"           read_resource, get_prompt (the resource itself)
//	             .evidence_class  String
//	context    .arguments   record          call_tool only: params.arguments (see ArgumentsRecord)
//	           .uri         String          read_resource only: the resource's URI (for a template,
//	                                        its URI template; for a completion, the ref's URI)
//	           .prompt      String          get_prompt only: the prompt's name at its upstream
//	           .session     { id: String, calls: Long, tools_used: Set<String> }
//	                                        calls and tools_used count tools/call requests only
//	           .now         datetime        decision time, millisecond precision
//	           .machine     String          call_tool to a tunnel upstream only: the machine id the
//	                                        call is routed to (absent otherwise: test `context has machine`)
//
// A policy whose action is not scoped applies to every action, and
// validates only if it reads what every action has: `resource in
// Upstream::"x"`, `resource.evidence_class`, `context.session`,
// `context.now`. A policy that reads a tool's attributes (annotations,
// name) or context.arguments must scope its action (`action in
// [Action::"call_tool", Action::"list_tools"]`), and one that reads
// context.uri or context.prompt to read_resource or get_prompt. So
// `permit (principal == Agent::"alice", action, resource in
// Upstream::"git")` lets alice call, list, read and get everything of git,
// and a bundle without a permit for read_resource denies every read.
// resources/unsubscribe is not decided (it only stops data).
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
//	// no code the gateway did not measure: its tools, resources and prompts
//	forbid (principal, action, resource) when { resource.evidence_class == "spawn-unmeasured" };
//
//	// resources of fs only under /srv/data
//	forbid (principal, action == Action::"read_resource", resource in Upstream::"fs")
//	unless { context.uri like "file:///srv/data/*" && !(context.uri like "*..*") };
//
//	// a read-only agent
//	permit (principal == Agent::"reporter", action in [Action::"call_tool", Action::"list_tools"], resource)
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
// the call with an error naming the limit; so does an argument the schema
// declares, sent with another JSON type than converts to the declared type,
// when some policy reads the arguments (see argtypes.go), and the members
// the schema does not declare are then left out of context.arguments. A Request fully
// determines its Decision: replay rebuilds the Request from the audit log
// and must get the recorded decision (for a read_resource that reads
// context.uri, with the URI from the payload vault: the log holds only its
// commitment).
//
// Modes (enforcing, advisory, silent) say what the gateway does with a deny;
// they do not change the decision.
package policy

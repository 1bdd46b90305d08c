package policy

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/cedar-policy/cedar-go/types"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"
	"github.com/cedar-policy/cedar-go/x/exp/schema/resolved"
	"github.com/go-json-experiment/json/jsontext"
)

// The bundle's schema declares the types of the arguments its policies
// read (CallArgs). Cedar compares values of different types without an
// error (`==` is false, `!=` true, contains() false), so an
// argument sent with another JSON type than declared would slip past a
// forbid that compares it, while the upstream still reads the value the
// forbid is about: {"count":1e3} or {"count":1000.0} for a Long 1000,
// "true" or 1 for a Bool, ["delete"] for a String. So every declared
// argument is checked, as it is converted, against its declared type, down
// through sets and declared attributes of nested records; one that does
// not match denies the call (an *ArgumentsError naming the declared
// attribute and the JSON kind received, never the value).
//
// The rule is the converter's own: a JSON value has the declared type when
// ArgumentsRecord makes a value of that type from it.
//
//	String    a JSON string (not a number, which becomes the String of its literal)
//	Long      a JSON integer in int64 range (no fraction, no exponent)
//	Bool      true or false
//	decimal   a JSON number with a point, at most four digits after it, no exponent, in decimal range
//	Set<T>    a JSON array whose elements (nulls aside) are each a T
//	record    a JSON object; its declared attributes are checked, a required one must be present (not null)
//
// Null is the absence of a value (the converter leaves it out): an
// optional attribute sent as null is not there, a required one is missing.
//
// Members a declared record does not declare are not checked, and they
// are left out of the record Cedar sees, as a null is: at every level,
// context.arguments itself included. Cedar compares records whole, so one
// member more makes `==` false and contains() miss: with
// `ops?: Set<{op: String}>`, {"ops":[{"op":"delete","x":0}]} would slip
// past `context.arguments.ops.contains({op: "delete"})` while the upstream
// reads op "delete". Nothing else of a validated policy can tell they are
// gone: the validator refuses reading an attribute the record does not
// declare, and a has test of one, which it accepts as always false, is
// refused at load (checkArgHas) rather than left to be silently false.
// At the top the same rule holds for the same reasons, though fewer
// policies could be fooled there: checkEntityModel has every attribute of
// CallArgs optional, and the strict validator refuses to compare such a
// record with a record literal ({path?: String} and {path: String} are not
// compatible), but a CallArgs that declares nothing makes
// `context.arguments == {}` valid, and has tests of undeclared members are
// accepted there too. With one rule the record Cedar sees always has the
// schema's type, which is what the validator assumes of it.
//
// The converter never makes an ipaddr, datetime or duration (JSON has
// none: a string stays a String) nor an entity reference (an object is a
// record), so an argument declared with one of those types could never be
// sent: Load refuses such a schema rather than deny every call that sends
// the argument.
//
// The types are checked only when some policy of the bundle reads
// context.arguments: no decision of a bundle that reads none could depend
// on them (and the schema template declares path). The decision cache
// (Memo) keys on the exact argument bytes, so a cached decision is one
// whose arguments were checked and converted the same way; replay decides
// with the same converter.

// argType is a declared argument type, compiled from the schema.
type argType struct {
	kind  argKind
	name  string             // as the schema spells it: Long, Set<String>, record
	elem  *argType           // argSet
	attrs map[string]argAttr // argRecord
	// required lists the record's attributes that are not optional, sorted.
	required []string
}

type argAttr struct {
	t        *argType
	optional bool
	index    int // in required; -1 when optional
}

type argKind uint8

const (
	argString argKind = iota
	argLong
	argBool
	argDecimal
	argSet
	argRecord
)

// callArgsType compiles the type of call_tool's context.arguments (a
// record type, which may declare no attribute: then every member is left
// out). The schema has passed checkEntityModel: context.arguments is a
// record type.
func callArgsType(s *resolved.Schema) (*argType, error) {
	act, ok := s.Actions[uidCallTool]
	if !ok || act.AppliesTo == nil {
		return nil, fmt.Errorf("no call_tool action")
	}
	a, ok := act.AppliesTo.Context["arguments"]
	if !ok {
		return nil, fmt.Errorf("call_tool's context has no arguments")
	}
	rec, ok := a.Type.(resolved.RecordType)
	if !ok {
		return nil, fmt.Errorf("call_tool's context.arguments is not a record type")
	}
	return compileArgType(rec, nil)
}

// compileArgType compiles the declared type t of the argument at path.
func compileArgType(t resolved.IsType, path []string) (*argType, error) {
	switch t := t.(type) {
	case resolved.StringType:
		return &argType{kind: argString, name: "String"}, nil
	case resolved.LongType:
		return &argType{kind: argLong, name: "Long"}, nil
	case resolved.BoolType:
		return &argType{kind: argBool, name: "Bool"}, nil
	case resolved.ExtensionType:
		if t == "decimal" {
			return &argType{kind: argDecimal, name: "decimal"}, nil
		}
		return nil, fmt.Errorf("%q is declared %s, but no JSON argument converts to %s (a JSON string stays a String), so every call that sends it would be denied",
			argPath(path), string(t), article(string(t)))
	case resolved.EntityType:
		return nil, fmt.Errorf("%q is declared as the entity type %s, but no JSON argument converts to an entity (a JSON object is a record), so every call that sends it would be denied",
			argPath(path), types.EntityType(t))
	case resolved.SetType:
		e, err := compileArgType(t.Element, append(slices.Clip(path), "[]"))
		if err != nil {
			return nil, err
		}
		return &argType{kind: argSet, name: "Set<" + e.name + ">", elem: e}, nil
	case resolved.RecordType:
		r := &argType{kind: argRecord, name: "record", attrs: make(map[string]argAttr, len(t))}
		for _, k := range slices.Sorted(maps.Keys(t)) {
			a := t[k]
			at, err := compileArgType(a.Type, append(slices.Clip(path), string(k)))
			if err != nil {
				return nil, err
			}
			aa := argAttr{t: at, optional: a.Optional, index: -1}
			if !a.Optional {
				aa.index = len(r.required)
				r.required = append(r.required, string(k))
			}
			r.attrs[string(k)] = aa
		}
		return r, nil
	}
	return nil, fmt.Errorf("%q has a type the gateway does not know (%T)", argPath(path), t)
}

// argPath renders the path of a declared argument: attribute names joined
// with dots, "[]" for the elements of a set (tags[], items[].name).
func argPath(path []string) string {
	var b strings.Builder
	for i, p := range path {
		if i > 0 && p != "[]" {
			b.WriteByte('.')
		}
		b.WriteString(p)
	}
	return b.String()
}

// article puts "a" or "an" before a type name.
func article(name string) string {
	if name == "" {
		return name
	}
	switch name[0] {
	case 'a', 'e', 'i', 'o', 'u', 'A', 'E', 'I', 'O', 'U':
		return "an " + name
	}
	return "a " + name
}

// matches reports whether a JSON token (not null) begins a value of the
// declared type: for a scalar, whether the converter makes a value of that
// type from it; for a set or a record, whether it opens an array or an
// object (their contents are checked as they are read).
func (t *argType) matches(tok jsontext.Token) bool {
	k := tok.Kind()
	switch t.kind {
	case argString:
		return k == '"'
	case argBool:
		return k == 't' || k == 'f'
	case argLong:
		if k != '0' {
			return false
		}
		_, ok := number(tok.String()).(types.Long)
		return ok
	case argDecimal:
		if k != '0' {
			return false
		}
		_, ok := number(tok.String()).(types.Decimal)
		return ok
	case argSet:
		return k == '['
	case argRecord:
		return k == '{'
	}
	return false
}

// mismatch is the error of a declared argument sent as tok, of another
// type than t. It names the declared path and the kinds, never the value.
func mismatch(t *argType, path []string, tok jsontext.Token) error {
	got, advice := "", ""
	switch tok.Kind() {
	case '"':
		got = "a string"
	case 't', 'f':
		got = "a boolean"
	case '{':
		got = "an object"
	case '[':
		got = "an array"
	case '0':
		got = "a number"
		lit := tok.String()
		frac := strings.IndexByte(lit, '.')
		exp := strings.ContainsAny(lit, "eE")
		switch {
		case t.kind == argLong && (frac >= 0 || exp):
			got, advice = "a number written with a fraction or exponent", "send it as an integer"
		case t.kind == argLong:
			got, advice = "an integer outside the Long range", "send an integer from "+strconv.FormatInt(-1<<63, 10)+" to "+strconv.FormatInt(1<<63-1, 10)
		case t.kind == argDecimal && exp:
			got = "a number written with an exponent"
		case t.kind == argDecimal && frac < 0:
			got = "an integer"
		case t.kind == argDecimal && len(lit)-frac-1 > 4:
			got = "a number with more than four digits after the point"
		case t.kind == argDecimal:
			got = "a number outside the decimal range"
		}
	}
	if advice == "" {
		switch t.kind {
		case argString:
			advice = "send a JSON string"
		case argLong:
			advice = "send a JSON integer"
		case argBool:
			advice = "send true or false"
		case argDecimal:
			advice = "send a JSON number with a decimal point and at most four digits after it, such as 1.5"
		case argSet:
			advice = "send a JSON array"
		case argRecord:
			advice = "send a JSON object"
		}
	}
	return &ArgumentsError{Reason: fmt.Sprintf("%q must be %s (the bundle's schema declares it); got %s: %s", argPath(path), article(t.name), got, advice)}
}

// missing is the error of a required attribute of a declared record that
// is absent or null.
func missing(t *argType, path []string) error {
	return &ArgumentsError{Reason: fmt.Sprintf("%q must be %s (the bundle's schema declares it, not optional); it is missing or null: send it", argPath(path), article(t.name))}
}

// checkArgHas refuses a policy that tests with has an attribute that a
// record of the arguments (context.arguments, or a record the schema
// declares in it) does not declare. The validator accepts such a test
// (it types it as always false) and the gateway leaves undeclared members
// out of context.arguments (see above), so the test is always false: a
// forbid written with it would never match. The records are followed
// through attribute accesses, if-then-else and record literals, every way
// a Cedar expression reaches a record of the context.
func checkArgHas(p *xast.Policy, args *argType) error {
	var err error
	for _, c := range p.Conditions {
		xast.Inspect(xast.NewNode(c.Body), func(n xast.IsNode) bool {
			h, ok := n.(xast.NodeTypeHas)
			if !ok || err != nil {
				return err == nil
			}
			for _, r := range argRefs(h.Arg, args) {
				if r.t != nil && r.t.kind == argRecord && r.t.attrs[string(h.Value)].t == nil {
					name := argPath(append(slices.Clip(r.path), string(h.Value)))
					err = fmt.Errorf("%q is tested with has, but the schema's CallArgs does not declare it, so the test is always false: the gateway leaves the members the schema does not declare out of context.arguments", name)
					return false
				}
			}
			return true
		})
	}
	return err
}

// argRef is what an expression may be: the context record, a record of
// the arguments of declared type t at path, or a record literal.
type argRef struct {
	context bool
	t       *argType
	path    []string
	lit     *xast.NodeTypeRecord
}

// argRefs returns what the expression n may be among the records
// checkArgHas follows (nothing when it is none of them).
func argRefs(n xast.IsNode, args *argType) []argRef {
	switch n := n.(type) {
	case xast.NodeTypeVariable:
		if n.Name == "context" {
			return []argRef{{context: true}}
		}
	case xast.NodeTypeRecord:
		return []argRef{{lit: &n}}
	case xast.NodeTypeIfThenElse:
		return append(argRefs(n.Then, args), argRefs(n.Else, args)...)
	case xast.NodeTypeAccess:
		var out []argRef
		for _, r := range argRefs(n.Arg, args) {
			switch {
			case r.context && n.Value == "arguments":
				out = append(out, argRef{t: args})
			case r.lit != nil:
				for _, e := range r.lit.Elements {
					if e.Key == n.Value {
						out = append(out, argRefs(e.Value, args)...)
					}
				}
			case r.t != nil && r.t.kind == argRecord:
				if a := r.t.attrs[string(n.Value)]; a.t != nil {
					out = append(out, argRef{t: a.t, path: append(slices.Clip(r.path), string(n.Value))})
				}
			}
		}
		return out
	}
	return nil
}

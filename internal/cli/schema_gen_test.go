package cli

import (
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

// schemaGen derives a JSON Schema (draft 2020-12) from Go types as
// encoding/json (tag "json") or the configuration's YAML decoder (tag
// "yaml") sees them: the members a document can hold, their types, which
// are always there. docs/schema/*.schema.json are made by it (see
// TestSchemasMatchTheGoTypes), so a schema cannot drift from the types.
type schemaGen struct {
	tag  string         // "json" or "yaml"
	defs map[string]any // $defs, by qualified type name (json only)
	errs []string
	// describe, when set, gives the description of the key at a path
	// (server.tokens.identity: slices add nothing, maps add "<name>").
	describe func(path string) string
}

var (
	typeTime       = reflect.TypeFor[time.Time]()
	typeDuration   = reflect.TypeFor[time.Duration]()
	typeDigest     = reflect.TypeFor[digest.Digest]()
	typeHexBytes   = reflect.TypeFor[evidence.HexBytes]()
	typeRawMessage = reflect.TypeFor[json.RawMessage]()
	typeMarshaler  = reflect.TypeFor[json.Marshaler]()
	typeMarshalerV = reflect.TypeFor[jsonv2.MarshalerTo]()
	typeText       = reflect.TypeFor[encoding.TextMarshaler]()
)

const (
	// digestPattern: a digest.Digest as text (empty when zero).
	digestPattern = `^(sha256:[0-9a-f]{64})?$`
	// decimalPattern: an integer written as a decimal string (",string").
	decimalPattern = `^-?[0-9]+$`
	// durationPattern: a Go duration as the YAML decoder reads it (10s, 1m30s, 250ms).
	durationPattern = `^-?(0|([0-9]+(\.[0-9]*)?(ns|us|µs|ms|s|m|h))+)$`
)

func newSchemaGen(tag string) *schemaGen {
	return &schemaGen{tag: tag, defs: map[string]any{}}
}

// nullable lets s be null too: what encoding/json writes for a nil slice,
// map or pointer that is not omitted.
func nullable(s map[string]any) map[string]any {
	return map[string]any{"anyOf": []any{s, map[string]any{"type": "null"}}}
}

func (g *schemaGen) schema(t reflect.Type, asString bool, path string) map[string]any {
	switch t {
	case typeTime:
		return map[string]any{"type": "string", "format": "date-time"}
	case typeDuration:
		if g.tag == "yaml" {
			return map[string]any{"anyOf": []any{
				map[string]any{"type": "string", "pattern": durationPattern},
				map[string]any{"type": "integer"},
			}}
		}
		return map[string]any{"type": "integer", "description": "nanoseconds"}
	case typeDigest:
		return map[string]any{"type": "string", "pattern": digestPattern}
	case typeHexBytes:
		return map[string]any{"type": "string", "pattern": `^([0-9a-f]{2})*$`}
	case typeRawMessage:
		return map[string]any{}
	}
	if t.Kind() != reflect.Pointer && t.Kind() != reflect.Interface &&
		(t.Implements(typeMarshaler) || reflect.PointerTo(t).Implements(typeMarshaler) ||
			t.Implements(typeMarshalerV) || reflect.PointerTo(t).Implements(typeMarshalerV) ||
			t.Implements(typeText) || reflect.PointerTo(t).Implements(typeText)) {
		g.errs = append(g.errs, fmt.Sprintf("%s marshals itself: give schemaGen.schema a case for it", t))
		return map[string]any{}
	}
	switch t.Kind() {
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if asString {
			return map[string]any{"type": "string", "pattern": decimalPattern}
		}
		if t.Kind() >= reflect.Uint {
			return map[string]any{"type": "integer", "minimum": 0}
		}
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Interface:
		return map[string]any{}
	case reflect.Pointer:
		return nullable(g.schema(t.Elem(), asString, path))
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return nullable(map[string]any{"type": "string", "contentEncoding": "base64"})
		}
		return nullable(map[string]any{"type": "array", "items": g.schema(t.Elem(), false, path)})
	case reflect.Array:
		return map[string]any{"type": "array", "items": g.schema(t.Elem(), false, path), "minItems": t.Len(), "maxItems": t.Len()}
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			g.errs = append(g.errs, fmt.Sprintf("%s: a map whose key is not a string", t))
		}
		return nullable(map[string]any{"type": "object", "additionalProperties": g.schema(t.Elem(), false, path+".<name>")})
	case reflect.Struct:
		name := t.String()
		if t.Name() == "" || g.tag == "yaml" {
			return g.object(t, path)
		}
		if _, ok := g.defs[name]; !ok {
			g.defs[name] = nil // a cycle refers to itself
			g.defs[name] = g.object(t, path)
		}
		return map[string]any{"$ref": "#/$defs/" + name}
	}
	g.errs = append(g.errs, fmt.Sprintf("%s: no JSON Schema for a %s", t, t.Kind()))
	return map[string]any{}
}

// field is one member of a struct as the encoder sees it.
type field struct {
	name     string
	typ      reflect.Type
	optional bool
	asString bool
}

// fields lists t's members, embedded structs inlined, as the encoder does.
func (g *schemaGen) fields(t reflect.Type) []field {
	var out []field
	for f := range t.Fields() {
		tag := f.Tag.Get(g.tag)
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" && opts == "" {
			continue
		}
		inline := g.tag == "json" && f.Anonymous && name == "" || g.tag == "yaml" && slices.Contains(strings.Split(opts, ","), "inline")
		if inline {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				out = append(out, g.fields(ft)...)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
			if g.tag == "yaml" {
				name = strings.ToLower(f.Name)
			}
		}
		o := strings.Split(opts, ",")
		out = append(out, field{name: name, typ: f.Type,
			optional: slices.Contains(o, "omitempty") || slices.Contains(o, "omitzero"),
			asString: slices.Contains(o, "string")})
	}
	return out
}

func (g *schemaGen) object(t reflect.Type, path string) map[string]any {
	props := map[string]any{}
	var required []string
	for _, f := range g.fields(t) {
		p := strings.TrimPrefix(path+"."+f.name, ".")
		ps := g.schema(f.typ, f.asString, p)
		if g.describe != nil {
			if d := g.describe(p); d != "" {
				ps["description"] = d
			}
		}
		props[f.name] = ps
		if !f.optional && g.tag == "json" {
			required = append(required, f.name)
		}
	}
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		slices.Sort(required)
		s["required"] = required
	}
	return s
}

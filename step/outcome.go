package step

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// Outcome is a step's rule for the outcome an operator gives it with a
// "done" decision: the JSON the step would have stored had it finished.
type Outcome interface {
	// Decode strictly decodes and validates result (decodeOutcome).
	Decode(result json.RawMessage) (any, error)
	// Shape is the outcome's JSON object with placeholder values, for
	// messages.
	Shape() string
}

// Validator is an outcome type that checks itself after decoding; its
// error names every problem.
type Validator interface {
	Validate() error
}

// OutcomeOf returns the Outcome of outcome type T. Its values compare equal
// for one T.
func OutcomeOf[T any]() Outcome { return outcomeOf[T]{} }

type outcomeOf[T any] struct{}

func (outcomeOf[T]) Decode(result json.RawMessage) (any, error) { return decodeOutcome[T](result) }

func (outcomeOf[T]) Shape() string { return shapeOf(reflect.TypeFor[T]()) }

// decodeOutcome decodes result into a T strictly (one JSON value, not null,
// no unknown field, each field of its JSON type) and validates it when T or
// *T is a Validator. The error, for an operator, starts with "result" and
// names T's shape, never Go's type names.
func decodeOutcome[T any](result json.RawMessage) (T, error) {
	var out T
	shape := OutcomeOf[T]().Shape()
	raw := bytes.TrimSpace(result)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return out, fmt.Errorf("result is required with done: the step's outcome, %s", shape)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return out, fmt.Errorf("%s; want %s", decodeProblem(err), shape)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return out, fmt.Errorf("result holds more than one JSON value; want %s", shape)
	}
	v, ok := any(out).(Validator)
	if !ok {
		v, ok = any(&out).(Validator)
	}
	if ok {
		if err := v.Validate(); err != nil {
			return out, fmt.Errorf("result: %v", err)
		}
	}
	return out, nil
}

// decodeProblem says what encoding/json's err found, without Go's names.
func decodeProblem(err error) string {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return fmt.Sprintf("result is not valid JSON (%s at byte %d)", strings.TrimPrefix(syntax.Error(), "json: "), syntax.Offset)
	case errors.As(err, &typ) && typ.Field != "":
		return fmt.Sprintf("result field %q must be %s, not %s", typ.Field, jsonKind(typ.Type), typ.Value)
	case errors.As(err, &typ):
		return fmt.Sprintf("result must be %s, not %s", jsonKind(typ.Type), typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "result is not valid JSON (it ends too early)"
	}
	if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return "result has the unknown field " + field
	}
	return "result cannot be decoded: " + strings.TrimPrefix(err.Error(), "json: ")
}

// jsonKind names the JSON type that decodes into t.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "a JSON value"
}

// shapeOf renders a struct type's JSON fields with placeholder values, or
// "a JSON value" for any other type.
func shapeOf(t reflect.Type) string {
	if t.Kind() != reflect.Struct {
		return "a JSON value"
	}
	var parts []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		placeholder := `"…"`
		switch jsonKind(f.Type) {
		case "a whole number", "a number":
			placeholder = "0"
		case "true or false":
			placeholder = "false"
		case "an object":
			placeholder = "{…}"
		case "an array":
			placeholder = "[…]"
		}
		parts = append(parts, fmt.Sprintf("%q:%s", name, placeholder))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

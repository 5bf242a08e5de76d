package llmsim

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// unmarshalExact decodes data into v (a pointer) as the providers read a body: a struct field
// takes only the member whose name is its JSON name exactly (after the JSON escapes decode), and
// of a name sent twice the last. encoding/json alone matches names in any case, Unicode folding
// included ("Stream" and "ſtream" are "stream" to it): a test using the simulator would then
// pass with a body the real provider reads otherwise (see internal/api's fieldnames.go, which
// refuses such names at submit). Members of other names are ignored, as json.Unmarshal ignores
// them. Structs, pointers to them and slices of them are walked; any other value (a string, a
// json.RawMessage, a map) is json.Unmarshal's. Only the fields of the Go value are matched:
// a map's keys are kept as sent.
func unmarshalExact(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("unmarshalExact: want a non-nil pointer, got %T", v)
	}
	return decodeExact(data, rv.Elem())
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

func decodeExact(data []byte, v reflect.Value) error {
	switch {
	case v.Type() == rawMessageType:
		return json.Unmarshal(data, v.Addr().Interface())
	case v.Kind() == reflect.Pointer && v.Type().Elem().Kind() == reflect.Struct:
		if isNull(trimJSON(data)) {
			v.SetZero()
			return nil
		}
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		return decodeExact(data, v.Elem())
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Struct:
		var elems []json.RawMessage
		if err := json.Unmarshal(data, &elems); err != nil {
			return err
		}
		if elems == nil {
			v.SetZero()
			return nil
		}
		s := reflect.MakeSlice(v.Type(), len(elems), len(elems))
		for i, e := range elems {
			if err := decodeExact(e, s.Index(i)); err != nil {
				return fmt.Errorf("[%d]: %w", i, err)
			}
		}
		v.Set(s)
		return nil
	case v.Kind() == reflect.Struct:
		var members map[string]json.RawMessage
		if err := json.Unmarshal(data, &members); err != nil {
			return fmt.Errorf("want a JSON object: %w", err)
		}
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			raw, ok := members[name]
			if !ok {
				continue
			}
			if err := decodeExact(raw, v.Field(i)); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		return nil
	default:
		return json.Unmarshal(data, v.Addr().Interface())
	}
}

// trimJSON drops JSON white space around data.
func trimJSON(data []byte) []byte {
	return []byte(strings.Trim(string(data), " \t\r\n"))
}

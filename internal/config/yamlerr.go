package config

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// yamlMessage is one of yaml.TypeError's messages: a value of the wrong kind (a duration without
// its unit, a word for a number), with the value (shortened past 10 characters) unless it is a
// list or a map, and the Go type it was to be decoded into; or an unknown key, with the Go type
// of the block it is in.
var yamlMessage = regexp.MustCompile("^line (\\d+): (?:cannot unmarshal (!!\\w+)(?: `(.*)`)? into (\\S+)|field (\\S+) not found in type (\\S+))$")

// nameFields prefixes each message of err, a yaml.TypeError from decoding data, with the field it
// is about (retry.base_delay, credentials[0].batch.window), as validation names a field: yaml
// gives only the line, and a one-line block holds several fields. A message whose field cannot be
// told apart is left as it is.
func nameFields(data []byte, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	var root yaml.Node
	if yaml.NewDecoder(bytes.NewReader(data)).Decode(&root) != nil {
		return err
	}
	// yaml reports a value reached through an alias (`*a`, `<<: *a`) at its anchor's line,
	// where the path is another field's: what lies under an aliased node is named by none.
	aliased := map[*yaml.Node]bool{}
	var findAliases func(n *yaml.Node)
	findAliases = func(n *yaml.Node) {
		if n.Kind == yaml.AliasNode && n.Alias != nil {
			aliased[n.Alias] = true
		}
		for _, c := range n.Content {
			findAliases(c)
		}
	}
	findAliases(&root)
	type place struct {
		path   string
		key    bool // the key of path, not its value
		shared bool // under an aliased node: reached by more than this path
		node   *yaml.Node
	}
	var places []place
	var walk func(n *yaml.Node, path string, shared bool)
	walk = func(n *yaml.Node, path string, shared bool) {
		shared = shared || aliased[n]
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path, shared)
			}
			return
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := n.Content[i].Value
				if path != "" {
					p = path + "." + p
				}
				places = append(places, place{p, true, shared, n.Content[i]})
				walk(n.Content[i+1], p, shared)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				walk(c, path+"["+strconv.Itoa(i)+"]", shared)
			}
		}
		places = append(places, place{path, false, shared, n})
	}
	walk(&root, "", false)

	blocks := blockKeys()
	named := &yaml.TypeError{Errors: make([]string, len(te.Errors))}
	for i, msg := range te.Errors {
		named.Errors[i] = msg
		m := yamlMessage.FindStringSubmatch(msg)
		if m == nil {
			continue
		}
		named.Errors[i] = "line " + m[1] + ": " + inFileTerms(m, blocks)
		line, _ := strconv.Atoi(m[1])
		var found []place
		for _, p := range places {
			if p.node.Line != line || p.path == "" {
				continue
			}
			switch tag, value, key := m[2], m[3], m[5]; {
			case key != "": // an unknown key
				if p.key && p.node.Value == key {
					found = append(found, p)
				}
			case p.key || p.node.ShortTag() != tag:
			case value == "" || p.node.Value == value ||
				strings.HasSuffix(value, "...") && len(p.node.Value) > 10 && strings.HasPrefix(p.node.Value, strings.TrimSuffix(value, "...")):
				found = append(found, p)
			}
		}
		if len(found) == 1 && !found[0].shared {
			named.Errors[i] = found[0].path + ": " + named.Errors[i]
		}
	}
	return named
}

// inFileTerms says what m, a match of yamlMessage, is about as the file's writer sees it: an
// unknown key, with the key of its block it most likely meant, or what to write instead of the
// value, in place of yaml's tags and the Go types (config.Retry, time.Duration). blocks holds
// the keys of each block's Go type (blockKeys). A type it does not know keeps yaml's wording.
func inFileTerms(m []string, blocks map[string][]string) string {
	tag, value, into, key, in := m[2], m[3], m[4], m[5], m[6]
	if key != "" {
		if meant := closestKey(key, blocks[strings.TrimPrefix(in, "*")]); meant != "" {
			return "unknown key " + key + " (did you mean " + meant + "?)"
		}
		return "unknown key " + key
	}
	var want string
	switch t := strings.TrimPrefix(into, "*"); {
	case t == "time.Duration":
		want = "a duration with its unit, such as 30s or 500ms"
	case t == "bool":
		want = "true or false"
	case t == "string":
		want = "a string"
	case t == "float32" || t == "float64":
		want = "a number"
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		want = "a whole number"
	case strings.HasPrefix(t, "[]"):
		want = "a list"
	case strings.HasPrefix(t, "map[") || blocks[t] != nil:
		want = "a block of keys"
	default:
		return m[0][strings.Index(m[0], ": ")+2:]
	}
	got := strconv.Quote(value)
	switch tag {
	case "!!seq":
		got = "a list"
	case "!!map":
		got = "a block of keys"
	}
	return "want " + want + " (got " + got + ")"
}

// blockKeys maps the Go type of each block of the file (config.Config, config.Retry, ...) to
// its keys in the order of its fields.
func blockKeys() map[string][]string {
	blocks := map[string][]string{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || blocks[t.String()] != nil {
			return
		}
		keys := []string{}
		blocks[t.String()] = keys
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if !f.IsExported() || name == "-" || name == "" {
				continue
			}
			keys = append(keys, name)
			walk(f.Type)
		}
		blocks[t.String()] = keys
	}
	walk(reflect.TypeFor[Config]())
	return blocks
}

// closestKey is the key of keys that key most likely misspells: the same in another case, one
// that key begins (redis for redis_url), or one at most two edits away; "" if none is.
func closestKey(key string, keys []string) string {
	for _, k := range keys {
		if strings.EqualFold(k, key) {
			return k
		}
	}
	if len(key) >= 3 {
		for _, k := range keys {
			if strings.HasPrefix(k, strings.ToLower(key)+"_") {
				return k
			}
		}
	}
	best, bestDist := "", 3
	for _, k := range keys {
		if d := editDistance(strings.ToLower(key), k); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// wholeNumbers refuses a fraction written where the file takes a whole number (2.5 for
// worker.concurrency), which yaml.v3 truncates without a word (0.5 becomes 0, which takes the
// default), naming each such field as nameFields names a value of the wrong kind. A whole
// number written as a float (10.0, 4.194304e6) is left to yaml, which reads it exactly.
func wholeNumbers(data []byte) error {
	var root yaml.Node
	if yaml.NewDecoder(bytes.NewReader(data)).Decode(&root) != nil {
		return nil // yaml's own decode has said what is wrong
	}
	durationType := reflect.TypeFor[time.Duration]()
	var problems []string
	var walk func(n *yaml.Node, t reflect.Type, path string)
	walk = func(n *yaml.Node, t reflect.Type, path string) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if n.Kind == yaml.AliasNode && n.Alias != nil {
			n = n.Alias
		}
		switch {
		case n.Kind == yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, t, path)
			}
		case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
			for i := 0; i+1 < len(n.Content); i += 2 {
				key, value := n.Content[i].Value, n.Content[i+1]
				if key == "<<" { // a merge key: its mappings are this block's
					walk(value, t, path)
					continue
				}
				p := key
				if path != "" {
					p = path + "." + key
				}
				for f := range t.Fields() {
					if name, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); f.IsExported() && name == key {
						walk(value, f.Type, p)
					}
				}
			}
		case n.Kind == yaml.SequenceNode && t.Kind() == reflect.Slice:
			for i, c := range n.Content {
				walk(c, t.Elem(), path+"["+strconv.Itoa(i)+"]")
			}
		case n.Kind == yaml.SequenceNode && t.Kind() == reflect.Struct:
			for _, c := range n.Content { // the mappings a merge key lists
				walk(c, t, path)
			}
		case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" && t != durationType &&
			(t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64 || t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uint64):
			var f float64
			if n.Decode(&f) == nil && f == math.Trunc(f) {
				return
			}
			problems = append(problems, path+": line "+strconv.Itoa(n.Line)+": want a whole number (got "+strconv.Quote(n.Value)+")")
		}
	}
	walk(&root, reflect.TypeFor[Config](), "")
	if len(problems) == 0 {
		return nil
	}
	return &yaml.TypeError{Errors: problems}
}

package config

import (
	"bytes"
	"errors"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// yamlMessage is one of yaml.TypeError's messages: a value of the wrong kind (a duration without
// its unit, a word for a number), with the value (shortened past 10 characters) unless it is a
// list or a map; or an unknown key.
var yamlMessage = regexp.MustCompile("^line (\\d+): (?:cannot unmarshal (!!\\w+)(?: `(.*)`)? into |field (\\S+) not found in type )")

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

	named := &yaml.TypeError{Errors: make([]string, len(te.Errors))}
	for i, msg := range te.Errors {
		named.Errors[i] = msg
		m := yamlMessage.FindStringSubmatch(msg)
		if m == nil {
			continue
		}
		line, _ := strconv.Atoi(m[1])
		var found []place
		for _, p := range places {
			if p.node.Line != line || p.path == "" {
				continue
			}
			switch tag, value, key := m[2], m[3], m[4]; {
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
			named.Errors[i] = found[0].path + ": " + msg
		}
	}
	return named
}

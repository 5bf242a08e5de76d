// Package openapitest checks live HTTP answers against the API description, api/openapi.yaml:
// each answer's status must be documented for its operation, and its body must match the
// documented media type and schema (JSON Schema 2020-12, the dialect of OpenAPI 3.1; formats
// such as uuid and date-time are asserted). An event stream's events are checked one by one
// against the schema its media type names in x-event-data. It is for _test.go files only.
package openapitest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"gopkg.in/yaml.v3"
)

// specPath is the API description, relative to the repository's root.
const specPath = "api/openapi.yaml"

// docURL names the description as a JSON Schema resource, so that its $refs resolve.
const docURL = "file:///openapi.json"

// Spec is the compiled API description. It is safe for concurrent use.
type Spec struct {
	doc   map[string]any
	paths []pathTemplate

	mu       sync.Mutex
	compiler *jsonschema.Compiler
	schemas  map[string]*jsonschema.Schema // by JSON pointer into doc
}

// paramSegment stands for a path parameter in a pathTemplate's segments.
const paramSegment = "{}"

type pathTemplate struct {
	path     string   // as the description writes it: /v1/jobs/{id}
	segments []string // paramSegment stands for a parameter; a trailing slash makes a last "" segment
}

var (
	loadOnce   sync.Once
	loadedSpec *Spec
	loadErr    error
)

// Load returns the repository's API description, read and compiled once per test binary. It
// fails the test if the description cannot be read or is not valid.
func Load(t testing.TB) *Spec {
	t.Helper()
	loadOnce.Do(func() { loadedSpec, loadErr = load() })
	if loadErr != nil {
		t.Fatalf("load %s: %v", specPath, loadErr)
	}
	return loadedSpec
}

func load() (*Spec, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(filepath.Join(root, specPath))
	if err != nil {
		return nil, err
	}
	var y any
	if err := yaml.Unmarshal(raw, &y); err != nil {
		return nil, err
	}
	// Through JSON, so that numbers and maps have the types the validator expects.
	j, err := json.Marshal(y)
	if err != nil {
		return nil, fmt.Errorf("convert to JSON: %w", err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(j))
	if err != nil {
		return nil, err
	}
	m, ok := doc.(map[string]any)
	if !ok {
		return nil, errors.New("not an object")
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(docURL, doc); err != nil {
		return nil, err
	}
	s := &Spec{doc: m, compiler: c, schemas: map[string]*jsonschema.Schema{}}
	paths, _ := m["paths"].(map[string]any)
	for p := range paths {
		tpl := pathTemplate{path: p}
		for _, seg := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
			if strings.HasPrefix(seg, "{") {
				seg = paramSegment
			}
			tpl.segments = append(tpl.segments, seg)
		}
		s.paths = append(s.paths, tpl)
	}
	return s, nil
}

// repoRoot is the nearest directory above the working directory that holds go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Check reports how an answer departs from the description: nil when it conforms. path is the
// request's path; body the whole body as sent. The body of an answer to HEAD is not checked:
// net/http sends none, whatever the handler writes, and the answer of a connection over the
// cap (written before the request is read) is a GET's.
func (s *Spec) Check(method, path string, status int, header http.Header, body []byte) error {
	head := method == http.MethodHead
	tpl, ok := s.match(path)
	if !ok {
		// The description's promise for unknown paths: 404 not_found.
		if status != http.StatusNotFound {
			return fmt.Errorf("%s %s: no documented path, answered %d (want 404)", method, path, status)
		}
		if head {
			return nil
		}
		return s.checkBody("#/components/schemas/Error", "application/json", header, body)
	}
	op, ok := s.pointer("paths", tpl.path, strings.ToLower(method)).(map[string]any)
	if !ok {
		// A method the path does not serve: 405 with an Allow header.
		if status != http.StatusMethodNotAllowed || header.Get("Allow") == "" {
			return fmt.Errorf("%s %s: undocumented method, answered %d (want 405 with Allow)", method, tpl.path, status)
		}
		if head {
			return nil
		}
		return s.checkBody("#/components/schemas/Error", "application/json", header, body)
	}
	where := method + " " + tpl.path + " " + strconv.Itoa(status)
	resp, ptr := s.resolve(op["responses"], "#/paths/"+escape(tpl.path)+"/"+strings.ToLower(method)+"/responses")
	respObj, ptr := s.resolve(mapGet(resp, strconv.Itoa(status)), ptr+"/"+strconv.Itoa(status))
	if respObj == nil {
		return fmt.Errorf("%s: status not documented", where)
	}
	if err := s.checkHeaders(respObj, header); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if head {
		return nil
	}
	content, _ := respObj["content"].(map[string]any)
	if len(content) == 0 {
		if len(body) != 0 {
			return fmt.Errorf("%s: documented without a body, sent %d bytes", where, len(body))
		}
		return nil
	}
	mt, _, err := mime.ParseMediaType(header.Get("Content-Type"))
	if err != nil {
		return fmt.Errorf("%s: Content-Type %q: %w", where, header.Get("Content-Type"), err)
	}
	media, ok := content[mt].(map[string]any)
	if !ok {
		return fmt.Errorf("%s: Content-Type %s is not documented (%v)", where, mt, slices.Sorted(mapKeys(content)))
	}
	base := ptr + "/content/" + escape(mt)
	switch {
	case mt == "application/json":
		if _, ok := media["schema"]; !ok {
			return nil
		}
		if err := s.checkBody(base+"/schema", mt, header, body); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	case mt == "text/event-stream":
		if _, ok := media["x-event-data"]; !ok {
			return nil
		}
		if err := s.checkEvents(base+"/x-event-data", body); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	return nil
}

// checkHeaders requires the headers the response documents as required, and an integer's
// value to be one (Retry-After in seconds). A HEAD's answer carries its headers too.
func (s *Spec) checkHeaders(resp map[string]any, header http.Header) error {
	headers, _ := resp["headers"].(map[string]any)
	for _, name := range slices.Sorted(mapKeys(headers)) {
		h, _ := s.resolve(headers[name], "")
		v := header.Get(name)
		if v == "" {
			if required, _ := h["required"].(bool); required {
				return fmt.Errorf("header %s is required, not sent", name)
			}
			continue
		}
		if typ, _ := mapGet(h["schema"], "type").(string); typ == "integer" {
			if _, err := strconv.Atoi(v); err != nil {
				return fmt.Errorf("header %s: %q is not an integer", name, v)
			}
		}
	}
	return nil
}

// checkBody validates a JSON body against the schema at ptr.
func (s *Spec) checkBody(ptr, mt string, header http.Header, body []byte) error {
	if got, _, _ := mime.ParseMediaType(header.Get("Content-Type")); got != mt {
		return fmt.Errorf("Content-Type %q, want %s", header.Get("Content-Type"), mt)
	}
	return s.Validate(ptr, body)
}

// checkEvents validates the data of every complete event of a stream against the schema at ptr.
func (s *Spec) checkEvents(ptr string, body []byte) error {
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, len(body)+1)
	var data []string
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if data != nil {
				if err := s.Validate(ptr, []byte(strings.Join(data, "\n"))); err != nil {
					return fmt.Errorf("event data: %w", err)
				}
			}
			data = nil
			continue
		}
		if v, ok := strings.CutPrefix(line, "data:"); ok {
			data = append(data, strings.TrimPrefix(v, " "))
		}
	}
	return nil // a last event cut short by a client that left is not checked
}

// Validate reports how a JSON document departs from the schema at ptr, a JSON pointer into the
// description ("#/components/schemas/SubmitRequest"): nil when it conforms. Tests check what a
// client may send with it, as Check checks what the server answers.
func (s *Spec) Validate(ptr string, body []byte) error {
	sch, err := s.schema(ptr)
	if err != nil {
		return err
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("body is not JSON: %w", err)
	}
	if err := sch.Validate(v); err != nil {
		return fmt.Errorf("body %s does not match %s: %#v", truncate(body), ptr, err)
	}
	return nil
}

// schema compiles the schema at ptr once.
func (s *Spec) schema(ptr string) (*jsonschema.Schema, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sch, ok := s.schemas[ptr]; ok {
		return sch, nil
	}
	sch, err := s.compiler.Compile(docURL + ptr)
	if err != nil {
		return nil, fmt.Errorf("compile %s: %w", ptr, err)
	}
	s.schemas[ptr] = sch
	return sch, nil
}

// match finds the documented path of a request path; a literal segment beats a parameter, which
// matches a segment that is not empty. A trailing slash makes another path (/v1/jobs/ is not
// /v1/jobs, /console/ is not /console), in the description as for the server's routes.
func (s *Spec) match(path string) (pathTemplate, bool) {
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	var best pathTemplate
	bestLiterals := -1
	for _, tpl := range s.paths {
		if len(tpl.segments) != len(segs) {
			continue
		}
		literals, ok := 0, true
		for i, seg := range tpl.segments {
			switch {
			case seg == paramSegment && segs[i] != "":
			case seg != paramSegment && seg == segs[i]:
				literals++
			default:
				ok = false
			}
		}
		if ok && literals > bestLiterals {
			best, bestLiterals = tpl, literals
		}
	}
	return best, bestLiterals >= 0
}

// resolve follows a $ref to components, returning the object and its JSON pointer.
func (s *Spec) resolve(v any, ptr string) (map[string]any, string) {
	m, _ := v.(map[string]any)
	for m != nil {
		ref, ok := m["$ref"].(string)
		if !ok {
			break
		}
		ptr = ref
		var keys []string
		for _, k := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			keys = append(keys, strings.ReplaceAll(strings.ReplaceAll(k, "~1", "/"), "~0", "~"))
		}
		m, _ = s.pointer(keys...).(map[string]any)
	}
	return m, ptr
}

func (s *Spec) pointer(keys ...string) any {
	var v any = s.doc
	for _, k := range keys {
		v = mapGet(v, k)
	}
	return v
}

func mapGet(v any, k string) any {
	m, _ := v.(map[string]any)
	return m[k]
}

func mapKeys(m map[string]any) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// escape makes a key a JSON pointer token.
func escape(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}

func truncate(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// Handler serves h and checks every answer against the description; the test fails, when it
// ends, for each answer that departs from it. Wrap the handler before starting its server, so
// that the server (registered later) is closed before the check reports.
func Handler(t testing.TB, h http.Handler) http.Handler {
	t.Helper()
	s := Load(t)
	var mu sync.Mutex
	var failures []string
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, f := range failures {
			t.Errorf("answer departs from %s: %s", specPath, f)
		}
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &Recorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if rec.Status == 0 && rec.Body.Len() == 0 && r.Context().Err() != nil {
			return // the client left before an answer: none was written, none to check
		}
		if rec.Status == 0 {
			rec.Status = http.StatusOK
		}
		if err := s.Check(r.Method, r.URL.Path, rec.Status, w.Header(), rec.Body.Bytes()); err != nil {
			mu.Lock()
			if len(failures) < 20 {
				failures = append(failures, err.Error())
			}
			mu.Unlock()
		}
	})
}

// Recorder is a ResponseWriter that keeps the status and a copy of the body of the answer
// written through it. Wrap the writer given to a handler: &Recorder{ResponseWriter: w}.
type Recorder struct {
	http.ResponseWriter
	// Status is the answer's status (0 until the handler writes).
	Status int
	// Body is a copy of what the handler wrote.
	Body bytes.Buffer
}

// WriteHeader implements http.ResponseWriter.
func (w *Recorder) WriteHeader(code int) {
	if w.Status == 0 {
		w.Status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (w *Recorder) Write(p []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	w.Body.Write(p)
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController flush event streams through the recorder.
func (w *Recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// A scenario's section of docs/benchmarks.md is the text between its two markers; -write
// replaces it and keeps everything else (the prose around it).

// markers are the begin and end markers of the section of scenario name.
func markers(name string) (begin, end string) {
	return "<!-- " + name + ":begin -->", "<!-- " + name + ":end -->"
}

// errNoEndMarker is returned for a begin marker without an end marker after it.
var errNoEndMarker = errors.New("begin marker without an end marker after it")

// replaceSection returns doc with the section of name replaced by body (the markers are kept,
// each on its own line). Without the begin marker, a heading and the section are appended.
func replaceSection(doc, name, body string) (string, error) {
	begin, end := markers(name)
	if !strings.HasSuffix(body, "\n") {
		body += "\n"
	}
	section := begin + "\n" + body + end
	i := strings.Index(doc, begin)
	if i < 0 {
		if doc != "" {
			doc = strings.TrimRight(doc, "\n") + "\n\n"
		}
		return doc + "## " + name + "\n\n" + section + "\n", nil
	}
	j := strings.Index(doc[i+len(begin):], end)
	if j < 0 {
		return "", fmt.Errorf("section %s: %w", name, errNoEndMarker)
	}
	return doc[:i] + section + doc[i+len(begin)+j+len(end):], nil
}

// newDocument is what a missing benchmarks file starts with.
const newDocument = "# Benchmarks\n\nEach section is rewritten by the command shown in it, run in `bench/`.\n"

// writeSection replaces the section of name in the Markdown file at path with body, creating
// the file when missing. The file is replaced atomically.
func writeSection(path, name, body string) error {
	doc := newDocument
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		doc = string(data)
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("read %s: %w", path, err)
	}
	out, err := replaceSection(doc, name, body)
	if err != nil {
		return fmt.Errorf("update %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create directory of %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".bench-*.md")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(out)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

package e2e_test

import (
	"fmt"
	"regexp"
	"strings"
)

// The README's shell examples as one bash script. Conventions of README.md, which its tests
// hold it to:
//   - Every ```sh block is run, in order, by one bash (so a block may use the variables of an
//     earlier one), with errexit, nounset and pipefail: any failing command fails the test.
//   - A block that cannot run in a test (make run, docker compose, ...) is preceded, on the line
//     just above its fence, by <!-- not run: REASON -->. Only those are skipped.
//   - A shell block written ```bash, ```shell, ```console or ```zsh, or a block with no language,
//     is an error: it would look like an example and go untested.
//   - A line ending in `# => TEXT` must print exactly TEXT (after the shell expands its $vars).

// notRunMarker marks the block whose fence is on the next line as not run by the test.
var notRunMarker = regexp.MustCompile(`^<!-- not run: (.*\S)\s*-->$`)

// expectSuffix is a comment `# => TEXT` at the end of a command line.
var expectSuffix = regexp.MustCompile(`^(.*\S)\s+# => (.*\S)\s*$`)

// untestedShells are languages of blocks that look like shell examples but are not ```sh.
var untestedShells = map[string]bool{"": true, "bash": true, "shell": true, "console": true, "zsh": true}

// readmeBlock is one fenced block of the README.
type readmeBlock struct {
	line    int // of the opening fence, 1-based
	lang    string
	notRun  string // the reason given by a not-run marker, or ""
	content []string
}

// readmeBlocks splits markdown into its fenced blocks, with their not-run markers. It fails on
// a shell block that is not ```sh, a not-run marker not followed by a ```sh fence, a fence left
// open, and a markdown that holds no ```sh block to run.
func readmeBlocks(md string) ([]readmeBlock, error) {
	lines := strings.Split(md, "\n")
	var blocks []readmeBlock
	var open *readmeBlock
	runnable := 0
	for i, l := range lines {
		if open != nil {
			if strings.TrimSpace(l) == "```" {
				blocks = append(blocks, *open)
				open = nil
				continue
			}
			open.content = append(open.content, l)
			continue
		}
		if m := notRunMarker.FindStringSubmatch(l); m != nil {
			if i+1 >= len(lines) || lines[i+1] != "```sh" {
				return nil, fmt.Errorf("README.md:%d: a not-run marker must be on the line just above a ```sh fence", i+1)
			}
			continue
		}
		if strings.HasPrefix(l, "<!-- not run") {
			return nil, fmt.Errorf("README.md:%d: write the marker as <!-- not run: REASON -->", i+1)
		}
		lang, ok := strings.CutPrefix(strings.TrimSpace(l), "```")
		if !ok {
			continue
		}
		b := readmeBlock{line: i + 1, lang: lang}
		if i > 0 {
			if m := notRunMarker.FindStringSubmatch(lines[i-1]); m != nil {
				b.notRun = m[1]
			}
		}
		switch {
		case untestedShells[lang]:
			return nil, fmt.Errorf("README.md:%d: a ```%s block: write ```sh (run by TestReadme_Examples, or marked <!-- not run: REASON -->), or name its language (yaml, json, text)", i+1, lang)
		case lang == "sh" && b.notRun == "":
			runnable++
		}
		open = &b
	}
	if open != nil {
		return nil, fmt.Errorf("README.md:%d: the block is never closed", open.line)
	}
	if runnable == 0 {
		return nil, fmt.Errorf("README.md: no ```sh block to run")
	}
	return blocks, nil
}

// readmeScript turns the runnable blocks of md into one bash script whose line N is README.md's
// line N (other lines are blank), so that bash's line numbers and trace name README lines. Line 1
// (the README's title, never code) holds the prelude.
func readmeScript(md string) (string, error) {
	blocks, err := readmeBlocks(md)
	if err != nil {
		return "", err
	}
	out := make([]string, strings.Count(md, "\n")+1)
	out[0] = `set -euo pipefail; PS4='+ README.md:$LINENO: '; set -x; ` +
		`trap 'echo "README.md:$LINENO: exit status $?" >&2' ERR; ` +
		`__expect() { if [ "$__out" != "$2" ]; then set +x; printf 'README.md:%s: printed %q, the README says %q\n' "$1" "$__out" "$2" >&2; exit 1; fi; }`
	for _, b := range blocks {
		if b.lang != "sh" || b.notRun != "" {
			continue
		}
		if b.line < 2 {
			return "", fmt.Errorf("README.md:%d: a block on the first line", b.line)
		}
		for j, l := range b.content {
			n := b.line + 1 + j // README line of l
			if m := expectSuffix.FindStringSubmatch(l); m != nil {
				l = fmt.Sprintf(`__out=$(%s); __expect %d "%s"`, m[1], n, shellDoubleQuoted(m[2]))
			}
			out[n-1] = l
		}
	}
	return strings.Join(out, "\n"), nil
}

// shellDoubleQuoted escapes s for the inside of a double-quoted bash word, leaving $ alone so
// that an expectation may name a variable (`# => requeued $id3`).
func shellDoubleQuoted(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "`", "\\`").Replace(s)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ensureBinaries builds the api, worker and llmq (serve) binaries into bin when one is missing (or always with
// force), and warns when they are older than the sources they are built from.
func ensureBinaries(ctx context.Context, bin string, force bool, log logf) error {
	missing := false
	for _, name := range []string{"api", "worker", "llmq"} {
		if _, err := os.Stat(filepath.Join(bin, name)); err != nil {
			missing = true
		}
	}
	if !missing && !force {
		if src := newerSource(filepath.Join(bin, "worker"), "cmd", "internal", "migrations"); src != "" {
			log("warning: %s is older than %s; run `make build` or pass -build to measure the current code",
				filepath.Join(bin, "worker"), src)
		}
		return nil
	}
	out, err := filepath.Abs(bin)
	if err != nil {
		return fmt.Errorf("-bin: %w", err)
	}
	args := []string{"build", "-o", out + string(filepath.Separator), "./cmd/api", "./cmd/worker", "./cmd/llmq"}
	log("building the binaries in %s: go %s", repoRoot, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = repoRoot
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s in %s (run the bench in bench/, or pass -bin): %w\n%s", strings.Join(args, " "), repoRoot, err, msg)
	}
	return nil
}

// newerSource returns a .go or .sql file under the dirs of repoRoot modified after the file at
// binary, or "".
func newerSource(binary string, dirs ...string) string {
	bi, err := os.Stat(binary)
	if err != nil {
		return ""
	}
	var found string
	errFound := errors.New("found")
	for _, d := range dirs {
		_ = filepath.WalkDir(filepath.Join(repoRoot, d), func(path string, de os.DirEntry, err error) error {
			if err != nil || de.IsDir() || (!strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, ".sql")) ||
				strings.HasSuffix(path, "_test.go") {
				return nil
			}
			if fi, err := de.Info(); err == nil && fi.ModTime().After(bi.ModTime()) {
				found = path
				return errFound
			}
			return nil
		})
		if found != "" {
			return found
		}
	}
	return ""
}

package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// cmdBins are the programs the tests run as processes of their own, each cmd/<name>.
var cmdBins = []string{"llmq", "api", "worker", "ctl"}

// bins builds cmdBins once for the whole test binary, in one go build, into a temporary
// directory that TestMain removes (removeBins). The tests that ran their own go build, each
// while the others did, compiled the same packages several times over on a loaded machine;
// one of them ran out of its 5 minutes.
var bins = struct {
	once sync.Once
	dir  string
	out  []byte
	err  error
}{}

// binDir returns the directory of the programs of cmdBins, built on the first call.
func binDir(t *testing.T) string {
	t.Helper()
	bins.once.Do(func() {
		bins.dir, bins.err = os.MkdirTemp("", "llmq-e2e-bin-")
		if bins.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		args := []string{"build", "-o", bins.dir + string(filepath.Separator)}
		for _, name := range cmdBins {
			args = append(args, "github.com/llmq/llmq/cmd/"+name)
		}
		bins.out, bins.err = exec.CommandContext(ctx, "go", args...).CombinedOutput()
	})
	require.NoError(t, bins.err, "go build: %s", bins.out)
	return bins.dir
}

// removeBins removes binDir's directory, if a test made it.
func removeBins() {
	if bins.dir != "" {
		_ = os.RemoveAll(bins.dir)
	}
}

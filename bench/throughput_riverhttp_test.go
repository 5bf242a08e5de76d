package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// The River processes get back, from the command line the row builds, the config it started
// them with.
func TestRiverProcConfig_ArgsRoundTrip(t *testing.T) {
	t.Parallel()
	worker := riverProcConfig{dbURL: "postgres://x/db", listen: "127.0.0.1:20001", conns: 16, simURL: "http://127.0.0.1:9",
		maxWorkers: 200, fetchCooldown: 10 * time.Millisecond, fetchPoll: 50 * time.Millisecond}
	args := worker.args(riverWorkerCmd)
	require.Equal(t, riverWorkerCmd, args[0])
	got, err := parseRiverProc(riverWorkerCmd, args[1:], io.Discard)
	require.NoError(t, err)
	require.Equal(t, worker, got)

	api := riverProcConfig{dbURL: worker.dbURL, listen: worker.listen, conns: 8}
	args = worker.args(riverAPICmd)
	require.Equal(t, riverAPICmd, args[0])
	require.NotContains(t, args, "-sim-url", "the api takes only its own flags")
	got, err = parseRiverProc(riverAPICmd, api.args(riverAPICmd)[1:], io.Discard)
	require.NoError(t, err)
	require.Equal(t, api, got)
}

func TestRiverProcess(t *testing.T) {
	t.Parallel()
	_, ok := riverProcess("herd")
	require.False(t, ok, "a scenario is not a River process")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{riverAPICmd}, "-database-url is required"},
		{[]string{riverAPICmd, "-database-url", "postgres://x/db"}, "-listen is required"},
		{[]string{riverWorkerCmd, "-database-url", "postgres://x/db", "-listen", "127.0.0.1:1"}, "-sim-url is required"},
		{[]string{riverWorkerCmd, "-fetch-cooldown", "0s"}, "-fetch-cooldown"},
		{[]string{riverAPICmd, "-sim-url", "http://x"}, "flag provided but not defined: -sim-url"},
	} {
		_, _, err := runArgs(tc.args...)
		require.ErrorContains(t, err, tc.want, "%v", tc.args)
	}
}

func TestCallProvider(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sim := httptest.NewServer(llmsim.New(llmsim.Config{}))
	defer sim.Close()
	overloaded := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "overloaded", 529)
	}))
	defer overloaded.Close()
	hc := providerClient(4)
	defer hc.CloseIdleConnections() // first: the servers' Close waits for the connections

	answer, err := callProvider(ctx, hc, sim.URL, messagesBody(3))
	require.NoError(t, err)
	var msg struct {
		Type string `json:"type"`
	}
	require.NoError(t, json.Unmarshal(answer, &msg), "%s", answer)
	require.Equal(t, "message", msg.Type)

	_, err = callProvider(ctx, hc, overloaded.URL, messagesBody(3))
	require.ErrorContains(t, err, "provider answered 529: overloaded")
}

func TestRiverStatus(t *testing.T) {
	t.Parallel()
	require.Equal(t, "succeeded", riverStatus("completed"))
	require.Equal(t, "discarded", riverStatus("discarded"))
}

// The row is judged against llmq's target of 1.0 × River, like River's no-op row.
func TestThroughputReport_RiverOverHTTP(t *testing.T) {
	t.Parallel()
	tp, _ := parse[*throughput](t, "throughput", "-only", "riverhttp,llmq")
	tp.results = []tpResult{tpRun(tpRiverHTTP, 2500, ms(40)), tpRun(tpLLMQ, 2000, ms(5))}
	tp.rates = [][]float64{nil, nil}
	rep := tp.report()
	require.Equal(t, "River over HTTP: POST → River insert → 2 worker processes → provider → RecordOutput", rep.tables[0].rows[0][0])
	require.Equal(t, "0.80", rep.tables[0].rows[0][12], "llmq ÷ this")
	require.Contains(t, strings.Join(rep.notes, "\n"),
		"Throughput targets: llmq ÷ River over HTTP 0.80 (target ≥ 1.0): FAIL (llmq ÷ River over HTTP).")
}

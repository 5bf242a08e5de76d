package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// jobView is what one SSE client of a job's event stream read, stamped on the bench's clock.
type jobView struct {
	opened     time.Time   // the stream's headers were read
	running    time.Time   // the first running event (zero: none)
	firstDelta time.Time   // the first delta event
	text       []byte      // the text of the delta events since the last reset
	ends       []int       // len(text) after each delta event
	at         []time.Time // when each delta event was read
	deltas     int         // delta events read, resets included
	resets     int
	gaps       int // delta events whose offset was not len(text): a lost or repeated piece
}

// follow reads job id's event stream on apiURL from its first event (Last-Event-ID: 0) to its
// terminal event.
func follow(ctx context.Context, hc *http.Client, apiURL, id string) (*jobView, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, apiURL+"/v1/jobs/"+id+"/events", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Last-Event-ID", "0")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("job %s events: %w", id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("job %s events: answered %d", id, resp.StatusCode)
	}
	v := &jobView{opened: time.Now()}
	rd := bufio.NewReaderSize(resp.Body, 64<<10)
	var name string
	var data []byte
	for {
		line, err := rd.ReadSlice('\n')
		if err != nil {
			return v, fmt.Errorf("job %s events: stream ended before the terminal event: %w", id, err)
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0 && name != "":
			done, err := v.event(name, data, time.Now())
			if done || err != nil {
				return v, err
			}
			name, data = "", data[:0]
		case bytes.HasPrefix(line, []byte("event: ")):
			name = string(line[len("event: "):])
		case bytes.HasPrefix(line, []byte("data: ")):
			data = append(data, line[len("data: "):]...)
		}
	}
}

// event takes one event read at; done is true at the terminal event.
func (v *jobView) event(name string, data []byte, at time.Time) (done bool, err error) {
	switch name {
	case "running":
		if v.running.IsZero() {
			v.running = at
		}
	case "delta":
		var d struct {
			Offset int    `json:"offset"`
			Text   string `json:"text"`
		}
		if err := json.Unmarshal(data, &d); err != nil {
			return false, fmt.Errorf("delta event: %w", err)
		}
		v.delta(d.Offset, d.Text, at)
	case "reset":
		v.resets++
		v.text, v.ends, v.at = v.text[:0], v.ends[:0], v.at[:0]
	case "succeeded":
		return true, nil
	case "failed", "dead", "canceled":
		return true, fmt.Errorf("job ended %s", name)
	}
	return false, nil
}

// delta takes a piece of text at offset, read at.
func (v *jobView) delta(offset int, text string, at time.Time) {
	if v.firstDelta.IsZero() {
		v.firstDelta = at
	}
	v.deltas++
	if offset != len(v.text) {
		v.gaps++
	}
	v.text = append(v.text, text...)
	v.ends = append(v.ends, len(v.text))
	v.at = append(v.at, at)
}

// delivery sums what clients read against what the simulator sent them.
type delivery struct {
	clients    int
	delivered  int             // delta events read
	mismatched int             // clients whose final text is not what the simulator sent
	gaps       int             // delta events whose offset did not follow the text read
	resets     int             // reset events read
	lags       []time.Duration // per token and client: flushed → the delta event completing it read
	steady     []time.Duration // the same, for tokens flushed after the client read its first delta
}

// add takes one client's view v of a call the simulator sent as text, its tokens ending at ends
// and flushed at at.
func (d *delivery) add(text []byte, ends []int, at []time.Time, v *jobView) {
	d.clients++
	d.delivered += v.deltas
	d.gaps += v.gaps
	d.resets += v.resets
	if !bytes.Equal(v.text, text) {
		d.mismatched++
	}
	d.lags, d.steady = lags(d.lags, d.steady, ends, at, v)
}

// lags appends to all, for each token the provider sent, how long after its flush the client
// read the delta event that completed it, and to steady the same for the tokens flushed after
// the client had read its first delta event (its stream open and the attempt's running event
// read: the delta path alone, Redis and the API's write). Tokens the client never got are
// skipped (counted as a text mismatch by the caller).
func lags(all, steady []time.Duration, simEnds []int, simAt []time.Time, v *jobView) ([]time.Duration, []time.Duration) {
	j := 0
	for k, end := range simEnds {
		for j < len(v.ends) && v.ends[j] < end {
			j++
		}
		if j == len(v.ends) {
			break
		}
		lag := v.at[j].Sub(simAt[k])
		all = append(all, lag)
		if simAt[k].After(v.firstDelta) {
			steady = append(steady, lag)
		}
	}
	return all, steady
}

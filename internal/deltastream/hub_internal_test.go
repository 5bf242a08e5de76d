package deltastream

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/redistest"
)

// TestAfter: received entries are taken when the first one not read yet is the entry right
// after the last one read (the next n of its attempt, or the first of a later attempt after a
// reset); entries read already are skipped, whatever the order of their IDs' parts; any other
// first entry says one may be missing.
func TestAfter(t *testing.T) {
	d := json.RawMessage(`{"attempt":1}`)
	be := func(id string, seq, n int, kind string) batchEntry {
		return batchEntry{ID: id, S: seq, N: n, K: kind, D: d}
	}
	ent := func(b batchEntry) Entry { return Entry{ID: b.ID, Seq: b.S, N: b.N, Kind: b.K, Data: b.D} }
	a1, a2 := be("9-0", 2, 1, KindDelta), be("9-1", 2, 2, KindDelta)
	reset := be("10-0", 2, 3, KindReset)
	b1 := be("10-1", 5, 1, KindDelta)
	all := []batch{{Entries: []batchEntry{a1, a2}}, {Entries: []batchEntry{reset}}, {Entries: []batchEntry{b1}}}

	entries, ok := after(Entry{}, all)
	require.True(t, ok)
	require.Equal(t, []Entry{ent(a1), ent(a2), ent(reset), ent(b1)}, entries)

	entries, ok = after(ent(a2), all)
	require.True(t, ok, "read up to a2 (9-1 is before 10-0)")
	require.Equal(t, []Entry{ent(reset), ent(b1)}, entries)

	entries, ok = after(ent(b1), all)
	require.True(t, ok)
	require.Empty(t, entries)

	for name, tc := range map[string]struct {
		last    Entry
		batches []batch
	}{
		"an entry of the attempt missing":     {ent(a1), []batch{{Entries: []batchEntry{reset}}}},
		"a later attempt without a reset":     {ent(a2), []batch{{Entries: []batchEntry{b1}}}},
		"none read, and not the first":        {Entry{}, []batch{{Entries: []batchEntry{a2}}}},
		"not JSON (not a writer of ours)":     {Entry{}, []batch{{Entries: []batchEntry{{ID: "9-0", S: 2, N: 1, K: KindDelta}}}}},
		"a later attempt's second entry only": {ent(reset), []batch{{Entries: []batchEntry{be("10-2", 5, 2, KindDelta)}}}},
	} {
		entries, ok := after(tc.last, tc.batches)
		require.False(t, ok, name)
		require.Empty(t, entries, name)
	}
}

func TestIDAfter(t *testing.T) {
	require.True(t, idAfter("10-0", "9-5"))
	require.True(t, idAfter("9-10", "9-9"))
	require.False(t, idAfter("9-9", "9-9"))
	require.False(t, idAfter("9-9", "10-0"))
}

// TestFollower_InboxOverflowReadsTheBuffer: a follower that does not take its batches keeps at
// most inboxMax; past that they are dropped and Next says one may be missing (and is complete
// again after).
func TestFollower_InboxOverflowReadsTheBuffer(t *testing.T) {
	f := &Follower{wake: make(chan struct{}, 1)}
	d := json.RawMessage(`{}`)
	for i := range inboxMax + 1 {
		f.deliver(&batch{Entries: []batchEntry{{ID: "9-" + strconv.Itoa(i), S: 2, N: i + 1, K: KindDelta, D: d}}})
	}
	_, ok := f.Next(Entry{})
	require.False(t, ok, "more than inboxMax batches")
	f.deliver(&batch{Entries: []batchEntry{{ID: "10-0", S: 2, N: inboxMax + 2, K: KindDelta, D: d}}})
	entries, ok := f.Next(Entry{ID: "9-256", Seq: 2, N: inboxMax + 1})
	require.True(t, ok)
	require.Len(t, entries, 1)
}

// TestAttemptOf: an entry's attempt number is read from its JSON, at once in the writers' form
// ("attempt" first) and by decoding in any other; JSON without one is attempt 0.
func TestAttemptOf(t *testing.T) {
	for data, want := range map[string]int{
		`{"attempt":3,"offset":0,"type":"text","index":0,"text":"hi"}`: 3,
		`{"attempt":12}`:                  12,
		`{"offset":4,"attempt":2}`:        2,
		`{"attempt": 7 , "offset":0}`:     7,
		`{"attempt":1234567890123,"x":1}`: 1234567890123,
		`{"offset":0}`:                    0,
		`[]`:                              0,
	} {
		require.Equal(t, want, attemptOf([]byte(data)), data)
	}
}

// TestParseBatch proves that a batch published by the writers' script is read field by field
// (scanBatch) into what decoding it whole gives, and that a batch in another form (a writer of
// an earlier version, without "dl") is still read, by decoding.
func TestParseBatch(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"Redis": redistest.URL(), "Cluster": redistest.ClusterURL()} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rdb := redistest.ClientOf(t, url)
			b := New(Config{Redis: rdb, Prefix: redistest.PrefixOn(t, url)})
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			ps := rdb.Subscribe(ctx, b.Key("job1"))
			defer ps.Close()
			_, err := ps.Receive(ctx) // the subscription's confirmation
			require.NoError(t, err)
			require.NoError(t, b.write(b.keys("job1"), []entryValues{
				{seq: 4, n: 1, kind: KindDelta, data: []byte(`{"attempt":2,"offset":0,"type":"text","index":0,"text":"say \"hi\" \u00e9}]}"}`)},
				{seq: 4, n: 2, kind: KindReset, data: []byte(`{"attempt":2}`)},
			}))
			msg, err := ps.ReceiveMessage(ctx)
			require.NoError(t, err)

			scanned, ok := scanBatch([]byte(msg.Payload))
			require.True(t, ok, "the script's form is scanned: %s", msg.Payload)
			var decoded batch
			require.NoError(t, json.Unmarshal([]byte(msg.Payload), &decoded))
			require.Equal(t, decoded, scanned)
			require.Len(t, scanned.Entries, 2)
			require.Equal(t, KindReset, scanned.Entries[1].K)
		})
	}

	old := `{"entries":[{"id":"9-0","s":4,"n":1,"k":"delta","d":{"attempt":2,"text":"a"}}]}`
	_, ok := scanBatch([]byte(old))
	require.False(t, ok)
	got, ok := parseBatch([]byte(old))
	require.True(t, ok, "an earlier writer's batch is decoded")
	require.Equal(t, batch{Entries: []batchEntry{{ID: "9-0", S: 4, N: 1, K: KindDelta, D: json.RawMessage(`{"attempt":2,"text":"a"}`)}}}, got)

	for _, msg := range []string{
		`not a batch`,
		`{"entries":[{"id":"9-0","s":4,"n":1,"k":"delta","dl":5,"d":{"a":}}]}`,
		`{"entries":[{"id":"9-0","s":4,"n":1,"k":"delta","dl":3,"d":{a}}]}`,
	} {
		_, ok := parseBatch([]byte(msg))
		require.False(t, ok, msg)
	}
}

// FuzzScanBatch proves that whatever scanBatch reads is what decoding the message reads.
func FuzzScanBatch(f *testing.F) {
	f.Add([]byte(`{"entries":[{"id":"9-0","s":4,"n":1,"k":"delta","dl":24,"d":{"attempt":2,"text":"a"}}]}`))
	f.Add([]byte(`{"entries":[{"id":"9-0","s":4,"n":1,"k":"delta","dl":2,"d":{}},{"id":"9-1","s":4,"n":2,"k":"reset","dl":13,"d":{"attempt":2}}]}`))
	f.Add([]byte(`{"entries":[{"id":"9-0","s":04,"n":1,"k":"delta","dl":2,"d":{}}]}`))
	f.Fuzz(func(t *testing.T, msg []byte) {
		scanned, ok := scanBatch(msg)
		if !ok {
			return
		}
		var decoded batch
		if err := json.Unmarshal(msg, &decoded); err != nil {
			t.Fatalf("scanned %s, which does not decode: %v", msg, err)
		}
		if len(decoded.Entries) != len(scanned.Entries) {
			t.Fatalf("scanned %d entries of %s, decoded %d", len(scanned.Entries), msg, len(decoded.Entries))
		}
		for i, d := range decoded.Entries {
			s := scanned.Entries[i]
			if s.ID != d.ID || s.S != d.S || s.N != d.N || s.K != d.K || string(s.D) != string(d.D) {
				t.Fatalf("entry %d of %s: scanned %+v, decoded %+v", i, msg, s, d)
			}
		}
	})
}

// BenchmarkParseBatch is an API replica's own work per published batch of one token's entry.
func BenchmarkParseBatch(b *testing.B) {
	msg := []byte(`{"entries":[{"id":"1764763200000-12","s":4,"n":17,"k":"delta","dl":63,"d":{"attempt":1,"offset":64,"type":"text","index":0,"text":"tok "}}]}`)
	if _, ok := scanBatch(msg); !ok {
		b.Fatal("not in the script's form")
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := parseBatch(msg); !ok {
			b.Fatal("not a batch")
		}
	}
}

// TestQueuedConn_AWritePastItsDeadlineClosesTheConnection: Write returns at once, whatever the
// peer reads; the write that the peer did not take by its deadline fails the connection, so that
// its reader fails (and go-redis connects again), and every later Write returns that error.
func TestQueuedConn_AWritePastItsDeadlineClosesTheConnection(t *testing.T) {
	client, server := net.Pipe() // nothing reads server: a write blocks, as on a stalled network
	defer server.Close()
	q := newQueuedConn(client)
	defer q.Close()
	require.NoError(t, q.SetWriteDeadline(time.Now().Add(50*time.Millisecond)))
	n, err := q.Write([]byte("SUBSCRIBE"))
	require.NoError(t, err, "queued, not written")
	require.Equal(t, len("SUBSCRIBE"), n)

	require.NoError(t, q.SetReadDeadline(time.Now().Add(30*time.Second)))
	_, err = q.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.ErrClosedPipe, "the failed write closed the connection")
	_, err = q.Write([]byte("PING"))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "the write's failure")
}

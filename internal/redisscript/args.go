package redisscript

import (
	"strconv"
	"time"
)

// Args formats the arguments of one script call that change at every call (a time, a call id, a
// rate, a count) into one buffer, and hands out each as an argument sent from its bytes: on the
// wire the string it formats to, as the string or number boxed alone sent it. A string built for
// a call and boxed took two allocations (its bytes and its boxed header), an integer boxed one;
// a call's Args take one, whatever their number (unless they outgrow its room), and none when
// every argument is a small integer or empty: those are boxed without allocating.
//
// The zero Args is ready; it is for one call, and is not safe for concurrent use while being
// built. Its arguments read their bytes when the call is written (and written again, on a retry),
// from a buffer of their own that outlives the Args. Each prints (fmt) as the bytes it sends.
type Args struct {
	ar *arena // nil until an argument needs bytes
}

// arena holds the bytes of a call's arguments.
type arena struct {
	buf   []byte
	spans []span
	// bufRoom and spanRoom are where buf and spans start, so that both come in one allocation.
	bufRoom  [96]byte
	spanRoom [12]span
}

// span is one argument: the bytes from..to of its arena's buffer. A *span is what the call sends:
// a pointer boxed allocates nothing, and go-redis writes an encoding.BinaryMarshaler's bytes as a
// bulk string, as it writes a string.
type span struct {
	ar       *arena
	from, to int32
}

// MarshalBinary returns the argument's bytes, for go-redis's writer. It never fails. They end
// at the argument's end (their capacity too): appending to them cannot write over the next one.
func (s *span) MarshalBinary() ([]byte, error) { return s.ar.buf[s.from:s.to:s.to], nil }

// String returns the argument's bytes as a string: what fmt prints (go-redis's cmd.String() and
// a log line too), and what go-redis reads a key from (a Cluster client routes a call by its
// first key, which it reads with fmt.Sprint unless it is a string or a []byte).
func (s *span) String() string { return string(s.ar.buf[s.from:s.to]) }

func (a *Args) arena() *arena {
	if a.ar == nil {
		ar := &arena{}
		ar.buf, ar.spans = ar.bufRoom[:0], ar.spanRoom[:0]
		a.ar = ar
	}
	return a.ar
}

// Buf returns the buffer to append the next argument's bytes to, and End makes what was appended
// that argument: a.End(append(a.Buf(), ...)).
func (a *Args) Buf() []byte { return a.arena().buf }

// End returns the argument of the bytes appended to Buf's buffer since the last argument; b is
// that buffer, appended to.
func (a *Args) End(b []byte) any {
	ar := a.arena()
	from := len(ar.buf)
	ar.buf = b
	//nolint:gosec // a call's arguments are far below 2 GiB
	ar.spans = append(ar.spans, span{ar: ar, from: int32(from), to: int32(len(b))})
	return &ar.spans[len(ar.spans)-1]
}

// Int returns v as an argument: its decimal digits, as an integer boxed alone is sent (0..255 is
// boxed: Go boxes those without allocating).
func (a *Args) Int(v int64) any {
	if v >= 0 && v < 256 {
		return v
	}
	return a.End(strconv.AppendInt(a.Buf(), v, 10))
}

// Text returns s as an argument, its bytes copied: a string boxed alone took its header.
func (a *Args) Text(s string) any {
	if s == "" {
		return ""
	}
	return a.End(append(a.Buf(), s...))
}

// Float returns f as an argument: strconv.FormatFloat(f, 'g', -1, 64), the shortest exact form.
func (a *Args) Float(f float64) any { return a.End(strconv.AppendFloat(a.Buf(), f, 'g', -1, 64)) }

// Now returns NowArg(now) as an argument.
func (a *Args) Now(now func() time.Time) any {
	if now == nil {
		return ""
	}
	return a.End(strconv.AppendInt(a.Buf(), now().UnixMicro(), 10))
}

// NowCall returns NowArg(now) + " " + ids.Next() as one argument, a script's time and call id.
func (a *Args) NowCall(now func() time.Time, ids *CallIDs) any {
	b := a.Buf()
	if now != nil {
		b = strconv.AppendInt(b, now().UnixMicro(), 10)
	}
	return a.End(ids.append(append(b, ' ')))
}

// Call returns ids.Next() as an argument.
func (a *Args) Call(ids *CallIDs) any { return a.End(ids.append(a.Buf())) }

// Bytes returns *p as an argument sent from its bytes, read when the call is written (and written
// again, on a retry): on the wire as *p boxed alone, without boxing its slice header (one
// allocation) or copying its bytes. *p must not change until the call is done.
func Bytes(p *[]byte) any { return (*bytesArg)(p) }

// bytesArg is the argument of Bytes: a pointer boxed allocates nothing.
type bytesArg []byte

// MarshalBinary returns the argument's bytes, for go-redis's writer. It never fails.
func (b *bytesArg) MarshalBinary() ([]byte, error) { return *b, nil }

// String returns the argument's bytes as a string, as span's String does.
func (b *bytesArg) String() string { return string(*b) }

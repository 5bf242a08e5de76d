package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Retention is how long the workers keep finished jobs, per final status, before deleting them
// with their attempts, events and idempotency keys, how long they keep the operators' audit log,
// and how often the leading worker looks for expired ones. A period is written as a Go duration
// ("36h"), as days ("7d"), or as 0 or "off" to keep those rows forever; one is at least
// MinPeriod.
type Retention struct {
	// Succeeded is how long succeeded jobs are kept. Default 7d.
	Succeeded Period `yaml:"succeeded"`
	// Failed is how long failed jobs are kept. Default 7d.
	Failed Period `yaml:"failed"`
	// Canceled is how long canceled jobs are kept. Default 7d.
	Canceled Period `yaml:"canceled"`
	// Dead is how long dead letters are kept: they wait for an operator. Default 30d.
	Dead Period `yaml:"dead"`
	// Audit is how long the audit log's entries (ctl's and the console's actions) are kept.
	// Default 365d: a year of who did what, for a table of a few rows per operator action.
	// The tenants' rotated-out tokens are kept as long after their overlap ended (the retention
	// pass deletes them with their rotations' entries); off keeps both.
	Audit Period `yaml:"audit"`
	// Interval is the time between two retention passes of the leading worker; the first comes
	// as soon as it begins to lead, and a pass runs until nothing expired is left (the
	// next begins an interval after it began, or at once when it took longer). Default 1m; at
	// least 100ms.
	Interval time.Duration `yaml:"interval"`
}

// Default retention periods.
const (
	DefaultRetention     = 7 * 24 * time.Hour
	DefaultDeadRetention = 30 * 24 * time.Hour
	// DefaultAuditRetention is how long audit log entries are kept by default.
	DefaultAuditRetention = 365 * 24 * time.Hour
	// DefaultRetentionInterval is the default time between retention passes.
	DefaultRetentionInterval = time.Minute
)

// Period is a retention period. The zero Period stands for the field's default (it was not
// written); Keep makes one in code.
type Period struct {
	d   time.Duration
	set bool  // written in the file: an explicit 0 ("off") is not the default
	err error // what was written is not a period; validate names the field
}

// Keep returns a period of d; 0 keeps forever.
func Keep(d time.Duration) Period { return Period{d: d, set: true} }

// Duration returns the period; 0 means the rows are kept forever.
func (p Period) Duration() time.Duration { return p.d }

// UnmarshalYAML implements yaml.Unmarshaler. A value that is not a period is reported by
// validation, which names the field.
func (p *Period) UnmarshalYAML(n *yaml.Node) error {
	*p = Period{set: true}
	if n.Kind != yaml.ScalarNode {
		p.err = errPeriod
		return nil
	}
	p.d, p.err = parsePeriod(n.Value)
	return nil
}

var errPeriod = errors.New("must be a duration such as 36h, a number of days such as 7d, or off")

// errEmpty is the error of a period written without a value.
var errEmpty = errors.New("empty value: write a period such as 30d, or off")

// markEmpty marks the periods that the YAML document data names without a value ("dead:",
// "dead: null", "dead: ~", or an alias of such a value) as errors, which validate reports.
// yaml.v3 does not call Period's UnmarshalYAML for a null: the field would read as unwritten and
// silently take its default, whether the operator meant off or forgot the value. data was
// decoded (strictly) before.
func (r *Retention) markEmpty(data []byte) {
	var doc struct {
		Retention map[string]yaml.Node `yaml:"retention"`
	}
	if yaml.Unmarshal(data, &doc) != nil {
		return // not a mapping: the strict decode has said so
	}
	for _, f := range r.fields() {
		n, ok := doc.Retention[f.name]
		if !ok {
			continue
		}
		for n.Kind == yaml.AliasNode && n.Alias != nil { // "*none", its anchor's value a null
			n = *n.Alias
		}
		if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
			*f.p = Period{set: true, err: errEmpty}
		}
	}
}

// parsePeriod parses "off", "0", a whole number of days ("7d") or a Go duration ("36h").
func parsePeriod(s string) (time.Duration, error) {
	if s == "off" {
		return 0, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 || n > 100*365 {
			return 0, fmt.Errorf("%w (got %q)", errPeriod, s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%w (got %q)", errPeriod, s)
	}
	return d, nil
}

// fields are the retention periods with their names and defaults.
func (r *Retention) fields() []struct {
	name string
	p    *Period
	def  time.Duration
} {
	return []struct {
		name string
		p    *Period
		def  time.Duration
	}{
		{"succeeded", &r.Succeeded, DefaultRetention},
		{"failed", &r.Failed, DefaultRetention},
		{"canceled", &r.Canceled, DefaultRetention},
		{"dead", &r.Dead, DefaultDeadRetention},
		{"audit", &r.Audit, DefaultAuditRetention},
	}
}

func (r *Retention) withDefaults() {
	for _, f := range r.fields() {
		if !f.p.set {
			*f.p = Keep(f.def)
		}
	}
	if r.Interval == 0 {
		r.Interval = DefaultRetentionInterval
	}
}

// MinPeriod is the shortest retention period but 0 (off). Shorter, a result may be deleted
// before a slow client reads it, with its idempotency key (a retried submit then makes, and pays
// for, a second job), and a dead letter before an operator sees it; and "1m" meant as a month is
// a minute in a Go duration.
const MinPeriod = time.Hour

// validate reports each period that could not be read or is shorter than MinPeriod, naming its
// field.
func (r *Retention) validate(bad func(field, format string, args ...any)) {
	for _, f := range r.fields() {
		switch d := f.p.d; {
		case f.p.err != nil:
			bad("retention."+f.name, "%v", f.p.err)
		case d > 0 && d < MinPeriod:
			bad("retention."+f.name, "must be at least 1h, or off (got %s; m is minutes: a month is 30d)", d)
		}
	}
	if r.Interval < minInterval {
		// Shorter, the leader's passes would follow each other without a pause.
		bad("retention.interval", "must be at least 100ms, got %s", r.Interval)
	}
}

package process

import "runtime/debug"

// DefaultGCPercent is the garbage collector's target for llmq's processes when the environment
// names none (GOGC): a collection once the heap has grown by four times what the last one left
// live, instead of Go's once. A job allocates tens of kilobytes and keeps little of it, so with
// Go's default the collector ran every few hundred jobs and cost about a tenth of a job's
// instructions; at 400 it runs a quarter as often, for a heap some tens of megabytes larger.
const DefaultGCPercent = 400

// TuneGC sets the garbage collector's target to DefaultGCPercent unless getenv("GOGC") names
// one (Go has applied it then: an operator's choice, including "off", wins). GOMEMLIMIT, when
// set, still bounds the heap: the collector runs early as the limit nears. It returns the target
// in force.
func TuneGC(getenv func(string) string) int {
	if getenv("GOGC") != "" {
		p := debug.SetGCPercent(100)
		debug.SetGCPercent(p)
		return p
	}
	debug.SetGCPercent(DefaultGCPercent)
	return DefaultGCPercent
}

package redisscript

import (
	"strconv"
	"time"
)

// Prelude starts every script: num (a reply or argument as a number, nil when absent), fmt0 (an
// integer, %.0f), fmt (a float, %.17g) and clock (the caller's time in µs, or Redis TIME when the
// argument is empty).
const Prelude = `
local function num(x)
  if x == false or x == nil then return nil end
  return tonumber(x)
end
local function fmt0(x) return string.format('%.0f', x) end
local function fmt(x) return string.format('%.17g', x) end
-- clock returns the caller's time (ARGV) or, when it is empty, Redis TIME, so that every process
-- shares one clock.
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  pcall(redis.replicate_commands)
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
`

// NowArg is a script's "now" argument: now() in µs, or "" (Redis TIME) when now is nil.
func NowArg(now func() time.Time) string {
	if now == nil {
		return ""
	}
	return strconv.FormatInt(now().UnixMicro(), 10)
}

// Int reads an integer reply (or a numeric string reply); anything else is 0.
func Int(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

// String reads a string reply (or an integer reply, formatted); anything else is "".
func String(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return ""
}

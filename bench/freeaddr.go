package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// ephemeralRangeFile holds the kernel's range of ports for outgoing connections (Linux).
const ephemeralRangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// lowestFreePort is where freeAddr starts looking below the ephemeral range: above the ports
// of the services a machine of ours runs (Postgres, Redis, MariaDB, RabbitMQ, NATS, ...).
const lowestFreePort = 20000

// freeAddr returns a 127.0.0.1 address whose port was free a moment ago, for a child process to
// listen on. Where the kernel's ephemeral range is known, the port is drawn from below it: a
// port that "listen on :0" hands out is in that range, where any process's next outgoing
// connection may take it before the child binds it (a worker failed to start that way, "bind:
// address already in use"); below it, only a deliberate bind can.
func freeAddr() (string, error) {
	if lo, ok := ephemeralLow(); ok && lo > lowestFreePort {
		for range 100 {
			port := lowestFreePort + rand.IntN(lo-lowestFreePort)
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				continue // taken: draw again
			}
			addr := ln.Addr().String()
			ln.Close()
			return addr, nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// ephemeralLow is the lowest port of the kernel's ephemeral range; ok is false where it cannot
// be read (not Linux).
func ephemeralLow() (port int, ok bool) {
	b, err := os.ReadFile(ephemeralRangeFile)
	if err != nil {
		return 0, false
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0, false
	}
	port, err = strconv.Atoi(fields[0])
	return port, err == nil
}

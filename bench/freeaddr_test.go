package main

import (
	"net"
	"strconv"
	"testing"
)

func TestFreeAddr_PortIsBelowTheEphemeralRangeAndFree(t *testing.T) {
	lo, ok := ephemeralLow()
	if !ok {
		t.Skipf("%s not readable: the fallback is the kernel's choice", ephemeralRangeFile)
	}
	if lo <= lowestFreePort {
		t.Skipf("the ephemeral range starts at %d, below %d", lo, lowestFreePort)
	}
	for range 20 {
		addr, err := freeAddr()
		if err != nil {
			t.Fatal(err)
		}
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, err := strconv.Atoi(p)
		if err != nil {
			t.Fatal(err)
		}
		if port < lowestFreePort || port >= lo {
			t.Fatalf("freeAddr() = %s, want a port in [%d, %d): one the kernel never hands to outgoing connections", addr, lowestFreePort, lo)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listen on freeAddr()'s %s: %v", addr, err)
		}
		ln.Close()
	}
}

// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package endpoint

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// open is how many connections the listener holds.
func (ln *listener) open() int {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	return len(ln.conns)
}

// serve starts the endpoint on loopback with l; the handler answers
// /healthz "ok". It returns the address and the listener.
func serve(t *testing.T, l Limits) (string, *listener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var lim *listener
	serveWith(ctx, ln, mux, l, func(x *listener) { lim = x })
	return ln.Addr().String(), lim
}

// probe is the kubelet's HTTP probe: a fresh connection, no keep-alive,
// a 1 s timeout (the probes' default).
func probe(addr string) error {
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/healthz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// hold opens n connections to addr; the first keep of them make one
// request each and keep the connection alive (idle, as a keep-alive
// client leaves it), the others send nothing. Connections the server
// refuses are dropped.
func hold(t *testing.T, addr string, n, keep int) []net.Conn {
	t.Helper()
	var out []net.Conn
	t.Cleanup(func() {
		for _, c := range out {
			c.Close()
		}
	})
	for i := range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		out = append(out, c)
		if i < keep {
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n"); err == nil {
				if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
			_ = c.SetDeadline(time.Time{})
		}
	}
	return out
}

// stillOpen counts the connections the server has not closed: a read
// that times out finds it open, one that ends (EOF, reset) closed.
func stillOpen(conns []net.Conn) int {
	var mu sync.Mutex
	var wg sync.WaitGroup
	n := 0
	for _, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			_, err := c.Read(make([]byte, 1))
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				mu.Lock()
				n++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return n
}

// TestTenantIdleConnections (issue 34, row 7): a pod opens 2000
// connections to the agent's port on the node's IP, half of them idle
// keep-alive connections after a request, half silent. The server used
// to set only ReadHeaderTimeout: all 2000 stayed open (about 22 KiB
// each) and kept their goroutines. Now it holds at most its cap from one
// address, the kubelet's probes get through meanwhile, and the rest are
// closed once idle or silent past their timeouts (shortened here).
func TestTenantIdleConnections(t *testing.T) {
	l := DefaultLimits
	l.IdleTimeout, l.ReadHeaderTimeout = time.Second, time.Second
	addr, ln := serve(t, l)
	conns := hold(t, addr, 2000, 1000)
	for i := range 5 {
		if err := probe(addr); err != nil {
			t.Fatalf("probe %d while a tenant holds 2000 connections: %v", i, err)
		}
	}
	if open := stillOpen(conns); open > l.MaxConnsPerHost {
		t.Errorf("%d of the tenant's %d connections still open, want at most %d (one address)", open, len(conns), l.MaxConnsPerHost)
	}
	if n := ln.open(); n > l.MaxConnsPerHost {
		t.Errorf("the server holds %d connections, want at most %d", n, l.MaxConnsPerHost)
	}
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return stillOpen(conns) == 0 && ln.open() == 0, nil
	})
	if err != nil {
		t.Errorf("idle and silent connections not closed after their timeouts: %d open", stillOpen(conns))
	}
}

// TestCapsPerHostAndInAll: past the cap in all, the address with the
// most connections loses its oldest idle one, not another address's;
// where every connection serves a request, the newcomer is refused.
func TestCapsPerHostAndInAll(t *testing.T) {
	l := Limits{MaxConns: 4, MaxConnsPerHost: 3}
	ln := newListener(nil, l)
	mk := func(host string) *conn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		return ln.admit(addrConn{Conn: a, remote: host + ":1"})
	}
	a1, a2, b1 := mk("10.0.0.1"), mk("10.0.0.1"), mk("10.0.0.2")
	a3 := mk("10.0.0.1")
	if ln.open() != 4 || a1 == nil || a2 == nil || b1 == nil || a3 == nil {
		t.Fatalf("within the caps: %d open", ln.open())
	}
	b2 := mk("10.0.0.2") // past MaxConns: 10.0.0.1 holds the most
	if b2 == nil || ln.conns[a1] || !ln.conns[b1] {
		t.Errorf("past the cap in all: a1 kept %v, b1 kept %v, b2 %v", ln.conns[a1], ln.conns[b1], b2)
	}
	for _, c := range []*conn{a2, a3, b1, b2} {
		ln.track(c, http.StateActive)
	}
	if c := mk("10.0.0.3"); c != nil || ln.open() != 4 {
		t.Errorf("every connection serving a request: the newcomer was let in (%d open)", ln.open())
	}
	ln.track(a2, http.StateIdle)
	if c := mk("10.0.0.1"); c == nil || ln.conns[a2] {
		t.Errorf("a2 idle: it should have made room")
	}
	ln.track(b1, http.StateClosed)
	if ln.open() != 3 || ln.perHost["10.0.0.2"] != 1 {
		t.Errorf("after a close: %d open, %d of 10.0.0.2", ln.open(), ln.perHost["10.0.0.2"])
	}
}

type addrConn struct {
	net.Conn
	remote string
}

func (a addrConn) RemoteAddr() net.Addr { return fakeAddr(a.remote) }

type fakeAddr string

func (a fakeAddr) Network() string { return "tcp" }
func (a fakeAddr) String() string  { return string(a) }

// TestRequestLimits: headers over MaxHeaderBytes are answered 431; a
// request whose headers trickle in is cut at ReadHeaderTimeout.
func TestRequestLimits(t *testing.T) {
	l := DefaultLimits
	l.ReadHeaderTimeout = 500 * time.Millisecond
	addr, _ := serve(t, l)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: agent\r\nX-Big: %s\r\n\r\n", strings.Repeat("b", 2*l.MaxHeaderBytes+4096))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("oversized headers: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("oversized headers: %s, want 431", resp.Status)
	}

	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	_, _ = io.WriteString(slow, "GET /healthz HTTP/1.1\r\n")
	began := time.Now()
	_ = slow.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(slow); err != nil || time.Since(began) > 4*time.Second {
		t.Errorf("a trickling request was not cut at ReadHeaderTimeout: %v after %v", err, time.Since(began))
	}
}

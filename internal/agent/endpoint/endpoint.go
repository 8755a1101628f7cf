// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package endpoint serves the agent's HTTP endpoints (/metrics, /healthz,
// /readyz). The agent runs on the node's network (hostNetwork), so
// whatever can reach the node's IP can reach them: every pod of the
// cluster. The server is bounded against that: time limits on each phase
// of a connection, a cap on header size, and a cap on connections, in
// all and per remote address, that makes room for a newcomer by closing
// a connection that is not serving a request (the oldest one of the
// address with the most), so that the kubelet's probes and Prometheus'
// scrapes still get through while a tenant holds connections open.
package endpoint

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Limits bound the server.
type Limits struct {
	// ReadHeaderTimeout: a new connection's request headers must arrive
	// within it (a connection that sends nothing is closed then).
	ReadHeaderTimeout time.Duration
	// ReadTimeout: the whole request.
	ReadTimeout time.Duration
	// WriteTimeout: from the end of the request's headers to the end of
	// the response (a client that does not read is dropped then).
	WriteTimeout time.Duration
	// IdleTimeout: a keep-alive connection waiting for its next request.
	IdleTimeout time.Duration
	// MaxHeaderBytes: larger request headers are answered 431.
	MaxHeaderBytes int
	// MaxConns in all, MaxConnsPerHost per remote IP address.
	MaxConns, MaxConnsPerHost int
}

// DefaultLimits are the agent's. A probe or a scrape takes milliseconds
// and one connection; 128 connections of about 30 KiB each (a goroutine,
// its buffers, the kernel's socket) bound the server's share of the
// agent's memory to a few MiB.
var DefaultLimits = Limits{
	ReadHeaderTimeout: 5 * time.Second,
	ReadTimeout:       10 * time.Second,
	WriteTimeout:      10 * time.Second,
	IdleTimeout:       10 * time.Second,
	MaxHeaderBytes:    8 << 10,
	MaxConns:          128,
	MaxConnsPerHost:   16,
}

// Serve serves h on ln within l until ctx ends.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, l Limits) {
	serveWith(ctx, ln, h, l, nil)
}

// serveWith is Serve, handing the listener to seen first (tests).
func serveWith(ctx context.Context, ln net.Listener, h http.Handler, l Limits, seen func(*listener)) {
	lim := newListener(ln, l)
	if seen != nil {
		seen(lim)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		ConnState:         lim.track,
	}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown) // exiting: nothing to do about a slow client
	}()
	go func() {
		if err := srv.Serve(lim); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "HTTP server (metrics and probes)")
		}
	}()
}

// listener caps the connections it hands the server: past a cap it
// closes a connection that serves no request, of the newcomer's address
// (past MaxConnsPerHost) or of the address with the most (past MaxConns),
// the oldest first; where every one serves a request, the newcomer.
// Requests are bounded in time, so a slot frees within the limits.
type listener struct {
	net.Listener
	l       Limits
	mu      sync.Mutex
	conns   map[*conn]bool
	perHost map[string]int
	seq     uint64
}

type conn struct {
	net.Conn
	ln   *listener
	host string
	seq  uint64 // accept order
	busy bool   // serving a request (ConnState Active); under ln.mu
}

func newListener(ln net.Listener, l Limits) *listener {
	return &listener{Listener: ln, l: l, conns: map[*conn]bool{}, perHost: map[string]int{}}
}

// Accept returns the next connection within the caps.
func (ln *listener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if nc := ln.admit(c); nc != nil {
			return nc, nil
		}
	}
}

// admit counts c in and makes room for it; nil if it was refused.
func (ln *listener) admit(c net.Conn) *conn {
	host := c.RemoteAddr().String()
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	ln.mu.Lock()
	ln.seq++
	nc := &conn{Conn: c, ln: ln, host: host, seq: ln.seq}
	ln.conns[nc] = true
	ln.perHost[host]++
	var closing []*conn
	for {
		var v *conn
		switch {
		case ln.perHost[host] > ln.l.MaxConnsPerHost:
			v = ln.oldestIdleLocked(func(c *conn) bool { return c.host == host })
		case len(ln.conns) > ln.l.MaxConns:
			v = ln.oldestIdleLocked(ln.busiestLocked())
		}
		if v == nil && (ln.perHost[host] > ln.l.MaxConnsPerHost || len(ln.conns) > ln.l.MaxConns) {
			v = nc // every one serves a request
		}
		if v == nil {
			break
		}
		ln.dropLocked(v)
		closing = append(closing, v)
		if v == nc {
			break
		}
	}
	ln.mu.Unlock()
	for _, v := range closing {
		_ = v.Conn.Close()
	}
	if len(closing) > 0 && closing[len(closing)-1] == nc {
		return nil
	}
	return nc
}

// busiestLocked picks the connections of the address that holds the
// most with one not serving a request.
func (ln *listener) busiestLocked() func(*conn) bool {
	idle := map[string]bool{}
	for c := range ln.conns {
		idle[c.host] = idle[c.host] || !c.busy
	}
	best := ""
	for h := range idle {
		if idle[h] && (best == "" || ln.perHost[h] > ln.perHost[best] || ln.perHost[h] == ln.perHost[best] && h < best) {
			best = h
		}
	}
	return func(c *conn) bool { return c.host == best }
}

// oldestIdleLocked is the oldest connection that serves no request among
// those of; nil if none.
func (ln *listener) oldestIdleLocked(of func(*conn) bool) *conn {
	var out *conn
	for c := range ln.conns {
		if !c.busy && of(c) && (out == nil || c.seq < out.seq) {
			out = c
		}
	}
	return out
}

func (ln *listener) dropLocked(c *conn) {
	if !ln.conns[c] {
		return
	}
	delete(ln.conns, c)
	if ln.perHost[c.host]--; ln.perHost[c.host] == 0 {
		delete(ln.perHost, c.host)
	}
}

// track follows the server's view of each connection (http.Server's
// ConnState): a connection that reads a request is busy until it has
// answered it.
func (ln *listener) track(c net.Conn, state http.ConnState) {
	nc, ok := c.(*conn)
	if !ok {
		return
	}
	ln.mu.Lock()
	defer ln.mu.Unlock()
	switch state {
	case http.StateActive:
		nc.busy = true
	case http.StateIdle:
		nc.busy = false
	case http.StateHijacked, http.StateClosed:
		ln.dropLocked(nc)
	}
}

// Close leaves the caps' count.
func (c *conn) Close() error {
	c.ln.mu.Lock()
	c.ln.dropLocked(c)
	c.ln.mu.Unlock()
	return c.Conn.Close()
}

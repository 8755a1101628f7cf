// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// One agent at a time serves a node: it holds the state directory's lock
// while it prepares claims, moves VFs and publishes. In a rolling update
// (the DaemonSet's surge pod beside the old one) the new agent asks the
// old one to hand over and waits for the lock. The kubelet plugin library
// lets two instances run only when both are stateless across calls
// (kubeletplugin.RollingUpdate); the agent is not (MIG instances it made,
// VFs it placed, its NRI connection), so the old agent stops serving first
// (its plugins, NRI plugin and publishers stop, the hardware is closed)
// and the new one starts from the state on disk, as after a restart. The
// kubelet retries what it asks in between; running pods are untouched.
const (
	lockFile     = "agent.lock"
	handoverFile = "agent.handover"
	// handoverPoll is how often the serving agent looks for a request
	// and a waiting one retries the lock.
	handoverPoll = 200 * time.Millisecond
)

// stateLock is the held lock of a state directory.
type stateLock struct {
	dir string
	id  string
	f   *os.File
}

// lockState takes the state directory's lock for id (the pod UID, or the
// pid of an agent without one). If another agent holds it, it asks that
// one to hand over and waits, until ctx ends. The request is a file that
// the waiting agent keeps locked: one whose writer died (its lock gone)
// is no request.
func lockState(ctx context.Context, dir, id string, onWait func()) (*stateLock, error) {
	logger := klog.FromContext(ctx)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	var request *os.File
	defer func() {
		if request != nil {
			request.Close()
		}
	}()
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		if request == nil {
			if request, err = ask(filepath.Join(dir, handoverFile), id); err != nil {
				f.Close()
				return nil, fmt.Errorf("handover request: %w", err)
			}
			if request != nil {
				holder, _ := os.ReadFile(f.Name())
				logger.Info("Another agent serves this node: asked it to hand over", "holder", strings.TrimSpace(string(holder)), "stateDir", dir)
				if onWait != nil {
					onWait()
				}
			}
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(handoverPoll):
		}
	}
	if request != nil {
		os.Remove(request.Name())
		logger.Info("Took over the node from the previous agent")
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(id+"\n"), 0)
	return &stateLock{dir: dir, id: id, f: f}, nil
}

// ask writes a handover request and holds its lock while waiting; nil
// while another agent's request is locked (it waits already, or the
// serving agent is looking at it): asked again at the next poll.
func ask(path, id string) (*os.File, error) {
	r, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(r.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		r.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, err
	}
	if err := r.Truncate(0); err != nil {
		r.Close()
		return nil, err
	}
	if _, err := r.WriteAt([]byte(id+"\n"), 0); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// watch calls handover once another agent asks for the node, until ctx
// ends. A request nobody holds (its agent died) is removed.
func (l *stateLock) watch(ctx context.Context, handover func(by string)) {
	path := filepath.Join(l.dir, handoverFile)
	t := time.NewTicker(handoverPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r, err := os.Open(path)
		if err != nil {
			continue
		}
		err = unix.Flock(int(r.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		data, _ := os.ReadFile(path)
		r.Close()
		switch by := strings.TrimSpace(string(data)); {
		case err == nil:
			os.Remove(path) // its agent is gone
		case errors.Is(err, unix.EWOULDBLOCK) && by != "" && by != l.id:
			handover(by)
			return
		}
	}
}

// requested tells whether another agent asks for the node now (its
// request written; the watcher acts on it within handoverPoll).
func (l *stateLock) requested() bool {
	data, err := os.ReadFile(filepath.Join(l.dir, handoverFile))
	by := strings.TrimSpace(string(data))
	return err == nil && by != "" && by != l.id
}

// release drops the lock.
func (l *stateLock) release() { l.f.Close() }

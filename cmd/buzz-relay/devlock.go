package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// devLockFile sits in the dev data directory while a dev relay uses it.
const devLockFile = "buzz-relay-dev.lock"

// devLockHolder is what the lock file tells a second instance.
type devLockHolder struct {
	PID        int    `json:"pid"`
	ListenAddr string `json:"listen_addr"`
}

// lockDataDir makes this process the only dev relay using dir. The lock is
// an flock, so the kernel drops it when the holder exits, even on kill -9: a
// stale file never blocks the next start.
func lockDataDir(dir, listenAddr string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, devLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		var holder devLockHolder
		raw, _ := os.ReadFile(path)
		_ = json.Unmarshal(raw, &holder)
		return nil, fmt.Errorf("a dev relay is already running on data directory %s (pid %d, listening on %s); "+
			"stop it first, or give this one its own BUZZ_DEV_DATA_DIR, BUZZ_DEV_PG_PORT, BUZZ_LISTEN_ADDR and BUZZ_METRICS_ADDR",
			dir, holder.PID, holder.ListenAddr)
	}
	holder, _ := json.Marshal(devLockHolder{PID: os.Getpid(), ListenAddr: listenAddr})
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt(append(holder, '\n'), 0)
	}
	return func() { f.Close() }, nil
}

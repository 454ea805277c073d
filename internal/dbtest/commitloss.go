package dbtest

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
)

// LoseCommitAnswer configures a pool (a PoolOn option) whose connections
// pass every byte on, but cut the connection once the server answered the
// cutAt-th COMMIT sent from when cutAt is set (0: cut nothing): the
// transaction committed, and the client only sees its connection lost
// during COMMIT, as after a network failure or a proxy's restart.
func LoseCommitAnswer(cutAt *atomic.Int32) func(*pgxpool.Config) {
	return loseAnswerAfter(isCommit, cutAt)
}

// isCommit reports whether p holds a simple-protocol Query message: 'Q', a
// 4-byte length, "commit\0".
func isCommit(p []byte) bool {
	i := bytes.Index(p, []byte("commit\x00"))
	return i >= 5 && p[i-5] == 'Q'
}

// LoseAnswerTo is LoseCommitAnswer for the cutAt-th statement whose text
// contains marker (a query's "-- name: X " comment, sent when a
// connection first prepares it): the server ran it, and the client sees
// its connection lost, as when a session is terminated or the network
// fails in the middle of a transaction.
func LoseAnswerTo(marker string, cutAt *atomic.Int32) func(*pgxpool.Config) {
	return loseAnswerAfter(func(p []byte) bool { return bytes.Contains(p, []byte(marker)) }, cutAt)
}

// loseAnswerAfter dials connections that cut themselves once the server
// answered the cutAt-th write that sends reports true for.
func loseAnswerAfter(sends func([]byte) bool, cutAt *atomic.Int32) func(*pgxpool.Config) {
	return func(cfg *pgxpool.Config) {
		var d net.Dialer
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &commitAnswerLoser{Conn: c, cutAt: cutAt, sends: sends}, nil
		}
	}
}

type commitAnswerLoser struct {
	net.Conn
	cutAt   *atomic.Int32
	sends   func([]byte) bool // whether a write holds the message to cut after
	cutNext atomic.Bool
}

func (c *commitAnswerLoser) Write(p []byte) (int, error) {
	if c.sends(p) && c.cutAt.Load() > 0 && c.cutAt.Add(-1) == 0 {
		c.cutNext.Store(true)
	}
	return c.Conn.Write(p)
}

func (c *commitAnswerLoser) Read(p []byte) (int, error) {
	if c.cutNext.Load() {
		_, _ = c.Conn.Read(make([]byte, 4096)) // the server's answer: it ran the statement
		_ = c.Conn.Close()
		return 0, io.ErrUnexpectedEOF
	}
	return c.Conn.Read(p)
}

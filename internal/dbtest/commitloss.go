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
	return func(cfg *pgxpool.Config) {
		var d net.Dialer
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &commitAnswerLoser{Conn: c, cutAt: cutAt}, nil
		}
	}
}

type commitAnswerLoser struct {
	net.Conn
	cutAt   *atomic.Int32
	cutNext atomic.Bool
}

func (c *commitAnswerLoser) Write(p []byte) (int, error) {
	// A simple-protocol Query message: 'Q', a 4-byte length, "commit\0".
	if i := bytes.Index(p, []byte("commit\x00")); i >= 5 && p[i-5] == 'Q' && c.cutAt.Load() > 0 && c.cutAt.Add(-1) == 0 {
		c.cutNext.Store(true)
	}
	return c.Conn.Write(p)
}

func (c *commitAnswerLoser) Read(p []byte) (int, error) {
	if c.cutNext.Load() {
		_, _ = c.Conn.Read(make([]byte, 4096)) // the server's answer: it committed
		_ = c.Conn.Close()
		return 0, io.ErrUnexpectedEOF
	}
	return c.Conn.Read(p)
}

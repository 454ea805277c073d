package pgcluster

import (
	"context"
	"net"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/localport"
)

// A port found free can be taken before the postmaster binds it (parallel
// test processes start servers all the time): Start picks another.
// Mutation killed: starting once on the first pick fails with "could not
// bind".
func TestStartRetriesAPortTakenMeanwhile(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	picks := 0
	pickPort = func() (int, error) {
		picks++
		if picks == 1 {
			return takenPort, nil
		}
		return localport.Free()
	}
	t.Cleanup(func() { pickPort = localport.Free })

	ctx := context.Background()
	c, err := StartTemp(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.Equal(t, 2, picks)
	require.NotEqual(t, takenPort, c.Port())
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
}

package pguuid_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/pguuid"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// Values of every shape the relay binds and scans survive a round trip
// through PostgreSQL unchanged, NULL included, and the plans are the
// codec's own rather than the Valuer's text round trip.
// Mutations killed: bytes copied in the wrong place or order (the
// round trip differs); the array type left pointing at pgx's element codec
// (its element plan is the Valuer's); NULL scanned as an error.
func TestUUIDRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(ctx) })
	require.NoError(t, pguuid.AfterConnect(ctx, conn))

	id, other := uuid.New(), uuid.New()
	var got uuid.UUID
	var text string
	require.NoError(t, conn.QueryRow(ctx, "SELECT $1::uuid, $1::uuid::text", id).Scan(&got, &text))
	require.Equal(t, id, got)
	require.Equal(t, id.String(), text, "the server got the same 16 bytes")

	var gotPtr *uuid.UUID
	require.NoError(t, conn.QueryRow(ctx, "SELECT $1::uuid", &other).Scan(&gotPtr))
	require.Equal(t, other, *gotPtr)
	require.NoError(t, conn.QueryRow(ctx, "SELECT NULL::uuid").Scan(&gotPtr))
	require.Nil(t, gotPtr)
	got = id
	require.NoError(t, conn.QueryRow(ctx, "SELECT NULL::uuid").Scan(&got))
	require.Equal(t, uuid.UUID{}, got, "NULL into a uuid.UUID leaves it zero, as uuid's own Scan did")

	var gotArray []uuid.UUID
	require.NoError(t, conn.QueryRow(ctx, "SELECT $1::uuid[], array_to_string($1::uuid[], ',')", []uuid.UUID{id, other}).Scan(&gotArray, &text))
	require.Equal(t, []uuid.UUID{id, other}, gotArray)
	require.Equal(t, id.String()+","+other.String(), text)

	m := conn.TypeMap()
	require.IsType(t, pguuid.EncodePlanForTest, m.PlanEncode(pgtype.UUIDOID, pgtype.BinaryFormatCode, id))
	array, ok := m.TypeForOID(pgtype.UUIDArrayOID)
	require.True(t, ok)
	require.IsType(t, pguuid.CodecForTest, array.Codec.(*pgtype.ArrayCodec).ElementType.Codec)
}

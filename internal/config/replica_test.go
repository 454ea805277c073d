package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestReplicaSettings(t *testing.T) {
	t.Parallel()
	c, err := FromEnv(env(map[string]string{
		"BUZZ_READ_DATABASE_URL":         " postgres://standby/buzz ",
		"BUZZ_DB_READ_POOL_SIZE":         "8",
		"BUZZ_REPLICA_READ_MAX_AGE_MS":   "250",
		"BUZZ_REPLICA_PROBE_INTERVAL_MS": "300",
	}))
	require.NoError(t, err)
	require.Equal(t, "postgres://standby/buzz", c.ReadDatabaseURL)
	require.EqualValues(t, 8, c.ReadPoolSize)
	require.Equal(t, 250*time.Millisecond, c.ReplicaReadMaxAge)
	require.Equal(t, 300*time.Millisecond, c.ReplicaProbeInterval)
	require.Equal(t, 150*time.Millisecond, c.ReplicaAcquireTimeout, "the documented budget")
	require.Equal(t, 960*time.Second, c.CreatedAtFloor)

	c, err = FromEnv(env(map[string]string{"BUZZ_REPLICA_READ_MAX_AGE_MS": "600000"}))
	require.NoError(t, err)
	require.Equal(t, MaxReplicaReadMaxAge, c.ReplicaReadMaxAge, "clamped to what the probe keeps")
	c, err = FromEnv(env(map[string]string{"BUZZ_REPLICA_READ_MAX_AGE_MS": "0"}))
	require.NoError(t, err)
	require.Zero(t, c.ReplicaReadMaxAge, "0 is off")

	for name, value := range map[string]string{
		"BUZZ_REPLICA_READ_MAX_AGE_MS":    "-1",
		"BUZZ_REPLICA_ACQUIRE_TIMEOUT_MS": "0",
		"BUZZ_DB_READ_POOL_SIZE":          "many",
		"BUZZ_REPLICA_PROBE_INTERVAL_MS":  "30000",
		// Ten digits: the trigger would read it as unset while the
		// probe's wall trusted it (and 10^10 s overflows a Duration).
		"BUZZ_REPLICA_CREATED_AT_FLOOR_SECS": "10000000000",
	} {
		_, err := FromEnv(env(map[string]string{name: value}))
		require.ErrorContains(t, err, name)
	}
}

// The old seconds-based setting stops start-up, naming its replacement.
func TestOldReplicaHeadMaxAgeIsAStartUpError(t *testing.T) {
	t.Parallel()
	_, err := FromEnv(env(map[string]string{"BUZZ_REPLICA_HEAD_MAX_AGE_SECS": "5"}))
	require.ErrorContains(t, err, "BUZZ_REPLICA_READ_MAX_AGE_MS")
	require.ErrorContains(t, err, "BUZZ_REPLICA_HEAD_MAX_AGE_SECS")
}

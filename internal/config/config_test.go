package config

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestDefaultsWhenUnset(t *testing.T) {
	t.Parallel()
	c, err := FromEnv(env(nil))
	require.NoError(t, err)
	require.Equal(t, Default(), c)
	require.Equal(t, "localhost:3000", c.RelayHost())
}

func TestValuesAreRead(t *testing.T) {
	t.Parallel()
	c, err := FromEnv(env(map[string]string{
		"BUZZ_DATABASE_URL":              "postgres://x",
		"BUZZ_RELAY_URL":                 "wss://Relay.Example.com",
		"BUZZ_LOG_LEVEL":                 "debug",
		"BUZZ_MAX_LIMIT":                 " 50 ",
		"BUZZ_WRITE_TIMEOUT":             "3s",
		"BUZZ_DB_MAX_CONNS":              "7",
		"BUZZ_PPROF_ADDR":                "127.0.0.1:6060",
		"BUZZ_MAX_SUBSCRIPTIONS":         "5",
		"BUZZ_MAX_MENTIONS_PER_EVENT":    "12",
		"BUZZ_MAX_THREAD_DEPTH":          "9",
		"BUZZ_MAX_CHANNEL_MEMBERS":       "250",
		"BUZZ_INGEST_GROUP_MAX":          "1",
		"BUZZ_INGEST_GROUP_WRITERS":      "3",
		"BUZZ_INGEST_QUEUE":              "10",
		"BUZZ_INGEST_GROUP_LOCK_TIMEOUT": "40ms",
		"BUZZ_INGEST_WRITE_TIMEOUT":      "7s",
	}))
	require.NoError(t, err)
	require.Equal(t, "postgres://x", c.DatabaseURL)
	require.Equal(t, "relay.example.com", c.RelayHost())
	require.Equal(t, slog.LevelDebug, c.LogLevel)
	require.Equal(t, 50, c.MaxLimit)
	require.Equal(t, 3*time.Second, c.WriteTimeout)
	require.Equal(t, int32(7), c.DBMaxConns)
	require.Equal(t, "127.0.0.1:6060", c.PprofAddr)
	require.Equal(t, 5, c.MaxSubscriptions)
	require.Equal(t, 12, c.MaxMentionsPerEvent)
	require.Equal(t, 9, c.MaxThreadDepth)
	require.Equal(t, 250, c.MaxChannelMembers)
	require.Equal(t, 1, c.IngestGroupMax)
	require.Equal(t, 3, c.IngestGroupWriters)
	require.Equal(t, 10, c.IngestQueue)
	require.Equal(t, 40*time.Millisecond, c.IngestGroupLockTimeout)
	require.Equal(t, 7*time.Second, c.IngestWriteTimeout)
}

// A malformed value stops start-up with an error naming the variable.
func TestMalformedValuesNameTheVariable(t *testing.T) {
	t.Parallel()
	for name, value := range map[string]string{
		"BUZZ_MAX_LIMIT":     "lots",
		"BUZZ_MAX_FILTERS":   "0",
		"BUZZ_SEND_QUEUE":    "-1",
		"BUZZ_WRITE_TIMEOUT": "10",
		"BUZZ_PING_INTERVAL": "-5s",
		"BUZZ_LOG_LEVEL":     "loud",
		"BUZZ_RELAY_URL":     "relay.example.com",
		"BUZZ_DB_MAX_CONNS":  "many",
	} {
		_, err := FromEnv(env(map[string]string{name: value}))
		require.ErrorContains(t, err, name, "%s=%q", name, value)
	}
}

// Media settings: defaults, values read, and a store that cannot work
// refused at start-up.
// Mutations killed: a BUZZ_MEDIA_* setting not wired into FromEnv; the s3
// store accepted without an endpoint or bucket; an unknown store accepted.
func TestMediaSettings(t *testing.T) {
	t.Parallel()
	c, err := FromEnv(env(nil))
	require.NoError(t, err)
	require.Equal(t, "fs", c.MediaStore)
	require.Empty(t, c.MediaDir, "media is off unless a directory is named")
	require.Equal(t, 100<<20, c.MediaMaxBytes)
	require.Equal(t, 16, c.MediaMaxUploads)
	require.Equal(t, 4, c.MediaMaxUploadsPerAddr)
	require.Equal(t, 10<<30, c.MediaCommunityQuotaBytes)
	require.Equal(t, DefaultMediaTypes, c.MediaAllowedTypes)
	require.True(t, c.MediaS3TLS)

	c, err = FromEnv(env(map[string]string{
		"BUZZ_MEDIA_STORE":                   "s3",
		"BUZZ_MEDIA_MAX_BYTES":               "1024",
		"BUZZ_MEDIA_ALLOWED_TYPES":           "image/png, Image/JPEG",
		"BUZZ_MEDIA_S3_ENDPOINT":             "127.0.0.1:9000",
		"BUZZ_MEDIA_S3_BUCKET":               "media",
		"BUZZ_MEDIA_S3_ACCESS_KEY":           "ak",
		"BUZZ_MEDIA_S3_SECRET_KEY":           "sk",
		"BUZZ_MEDIA_S3_REGION":               "eu-west-1",
		"BUZZ_MEDIA_S3_TLS":                  "false",
		"BUZZ_MEDIA_TEMP_DIR":                "/var/tmp",
		"BUZZ_MEDIA_MAX_UPLOADS":             "40",
		"BUZZ_MEDIA_MAX_UPLOADS_PER_ADDRESS": "2",
		"BUZZ_MEDIA_COMMUNITY_QUOTA_BYTES":   "1048576",
	}))
	require.NoError(t, err)
	require.Equal(t, 1024, c.MediaMaxBytes)
	require.Equal(t, []string{"image/png", "image/jpeg"}, c.MediaAllowedTypes)
	require.Equal(t, "127.0.0.1:9000", c.MediaS3Endpoint)
	require.Equal(t, "media", c.MediaS3Bucket)
	require.Equal(t, "ak", c.MediaS3AccessKey)
	require.Equal(t, "sk", c.MediaS3SecretKey)
	require.Equal(t, "eu-west-1", c.MediaS3Region)
	require.False(t, c.MediaS3TLS)
	require.Equal(t, "/var/tmp", c.MediaTempDir)
	require.Equal(t, 40, c.MediaMaxUploads)
	require.Equal(t, 2, c.MediaMaxUploadsPerAddr)
	require.Equal(t, 1<<20, c.MediaCommunityQuotaBytes)

	for name, vars := range map[string]map[string]string{
		"BUZZ_MEDIA_S3_ENDPOINT":   {"BUZZ_MEDIA_STORE": "s3", "BUZZ_MEDIA_S3_BUCKET": "b"},
		"BUZZ_MEDIA_STORE":         {"BUZZ_MEDIA_STORE": "ftp"},
		"BUZZ_MEDIA_S3_TLS":        {"BUZZ_MEDIA_S3_TLS": "maybe"},
		"BUZZ_MEDIA_MAX_BYTES":     {"BUZZ_MEDIA_MAX_BYTES": "0"},
		"BUZZ_MEDIA_ALLOWED_TYPES": {"BUZZ_MEDIA_ALLOWED_TYPES": "image/png,,"},
	} {
		_, err := FromEnv(env(vars))
		require.ErrorContains(t, err, name)
	}
}

func TestRedisSettings(t *testing.T) {
	t.Parallel()
	c, err := FromEnv(env(nil))
	require.NoError(t, err)
	require.Empty(t, c.RedisURL, "without BUZZ_REDIS_URL a process is the only relay")
	c, err = FromEnv(env(map[string]string{"BUZZ_REDIS_URL": "redis://10.0.0.5:6379/0", "BUZZ_REDIS_PUBLISH_QUEUE": "50"}))
	require.NoError(t, err)
	require.Equal(t, "redis://10.0.0.5:6379/0", c.RedisURL)
	require.Equal(t, 50, c.RedisPublishQueue)
	_, err = FromEnv(env(map[string]string{"BUZZ_REDIS_PUBLISH_QUEUE": "0"}))
	require.ErrorContains(t, err, "BUZZ_REDIS_PUBLISH_QUEUE")
}

// Mutation killed: the presence settings not read from the environment.
func TestPresenceSettings(t *testing.T) {
	t.Parallel()
	c, err := FromEnv(env(nil))
	require.NoError(t, err)
	require.Equal(t, time.Minute, c.PresenceTTL)
	require.Equal(t, 100000, c.PresenceMaxEntries)
	require.Equal(t, 64<<20, c.PresenceMaxBytes)
	require.Equal(t, 4<<20, c.PresenceMaxChannelBytes)
	c, err = FromEnv(env(map[string]string{"BUZZ_PRESENCE_TTL": "15s", "BUZZ_PRESENCE_MAX_ENTRIES": "10", "BUZZ_PRESENCE_MAX_BYTES": "4096",
		"BUZZ_PRESENCE_MAX_CHANNEL_BYTES": "2048"}))
	require.NoError(t, err)
	require.Equal(t, 15*time.Second, c.PresenceTTL)
	require.Equal(t, 10, c.PresenceMaxEntries)
	require.Equal(t, 4096, c.PresenceMaxBytes)
	require.Equal(t, 2048, c.PresenceMaxChannelBytes)
	_, err = FromEnv(env(map[string]string{"BUZZ_PRESENCE_TTL": "0s"}))
	require.ErrorContains(t, err, "BUZZ_PRESENCE_TTL")
}

// A standby's statement timeout at or past the read's whole budget would
// leave a read the standby cannot finish no time for the writer. Mutation
// killed: the check removed.
func TestReplicaStatementTimeoutLeavesTimeForTheWriter(t *testing.T) {
	t.Parallel()
	standby := map[string]string{"BUZZ_READ_DATABASE_URL": "postgres://standby.example/buzz"}
	_, err := FromEnv(env(standby))
	require.NoError(t, err, "the defaults (5 s of a 10 s budget) leave time")
	standby["BUZZ_REPLICA_STATEMENT_TIMEOUT_MS"] = "10000"
	_, err = FromEnv(env(standby))
	require.ErrorContains(t, err, "BUZZ_REPLICA_STATEMENT_TIMEOUT_MS (10s) must be below BUZZ_QUERY_TIMEOUT (10s)")
	delete(standby, "BUZZ_READ_DATABASE_URL")
	_, err = FromEnv(env(standby))
	require.NoError(t, err, "without a standby the setting is unused")
}

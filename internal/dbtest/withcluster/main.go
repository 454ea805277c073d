// Command withcluster starts one private PostgreSQL cluster, a streaming
// standby of it and one private redis-server, runs a command with their
// URLs in BUZZ_TEST_PG_URL, BUZZ_TEST_PG_STANDBY_URL and
// BUZZ_TEST_REDIS_URL, then stops them. `make test` wraps `go test ./...` in
// it so every test package shares them.
//
//	go run ./internal/dbtest/withcluster -- go test ./...
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/pgcluster"
	"github.com/buzzrelay/buzz/internal/redisserver"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: withcluster -- command [args...]")
		os.Exit(2)
	}
	os.Exit(run(args))
}

func run(args []string) int {
	cluster, err := pgcluster.StartTemp(context.Background(), dbtest.ClusterSettings)
	if err != nil {
		fmt.Fprintln(os.Stderr, "withcluster: start PostgreSQL:", err)
		return 1
	}
	defer cluster.Close()
	env := append(os.Environ(), dbtest.AdminURLEnv+"="+cluster.URL("postgres"))
	// One streaming standby of it, shared like the cluster: the replica
	// routing tests read their databases from it.
	// Without it the command still runs (make generate needs none); a
	// test that needs a standby then tries to make its own, and fails.
	if standby, err := pgcluster.StartStandby(context.Background(), cluster, dbtest.StandbySettings); err != nil {
		fmt.Fprintln(os.Stderr, "withcluster: no streaming standby for the tests that need one:", err)
	} else {
		defer standby.Close()
		env = append(env, dbtest.StandbyURLEnv+"="+standby.URL("postgres"))
	}
	// Without redis-server the command still runs (make generate needs only
	// PostgreSQL); a test that needs Redis then fails, naming the package.
	if redis, err := redisserver.Start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "withcluster: no redis-server for the tests that need one:", err)
	} else {
		defer redis.Close()
		env = append(env, dbtest.RedisURLEnv+"="+redis.URL())
	}

	// The child gets the terminal's signals itself; we only wait for it.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = env
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "withcluster:", err)
		return 1
	}
	return 0
}

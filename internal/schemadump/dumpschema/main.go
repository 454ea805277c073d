// Command dumpschema prints sql/schema.sql's content. It needs the test
// cluster's admin URL in BUZZ_TEST_PG_URL, so run it under
// internal/dbtest/withcluster (make generate does).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/schemadump"
)

func main() {
	adminURL := os.Getenv(dbtest.AdminURLEnv)
	if adminURL == "" {
		fmt.Fprintf(os.Stderr, "dumpschema: %s is not set; run under internal/dbtest/withcluster\n", dbtest.AdminURLEnv)
		os.Exit(1)
	}
	dump, err := schemadump.Dump(context.Background(), adminURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dumpschema:", err)
		os.Exit(1)
	}
	fmt.Print(dump)
}

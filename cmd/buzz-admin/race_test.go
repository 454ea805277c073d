//go:build race

package main

// raceEnabled: the binaries the process tests build are race-instrumented
// too, so they reuse the packages this test binary was compiled from.
const raceEnabled = true

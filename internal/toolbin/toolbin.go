// Package toolbin finds the module's bin/ directory, where `make tools`
// builds the binaries that keyed's test tooling runs (the Temporal CLI and
// server, stripe-mock). It is test tooling: no binary imports it.
package toolbin

import (
	"fmt"
	"os"
	"path/filepath"
)

// Dir returns bin/ in the nearest directory above the working directory
// that holds go.mod, whether or not bin/ exists yet. It returns an error
// when no directory above holds go.mod.
func Dir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find bin/: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "bin"), nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("find bin/: no go.mod above %s", wd)
		}
	}
}

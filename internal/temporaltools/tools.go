//go:build tools

package temporaltools

// The commands `make tools` builds from this module.
import (
	_ "go.temporal.io/server/cmd/server"
	_ "go.temporal.io/server/cmd/tools/sql"
)

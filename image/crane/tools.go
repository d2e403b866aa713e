//go:build tools

// Package tools pins crane (go-containerregistry), which image/build.sh
// builds to assemble and check the statusguard image without a container
// engine.
package tools

import _ "github.com/google/go-containerregistry/cmd/crane"

//go:build tools

// Package tools pins the kubectl command as a dependency of this wrapper
// module so that `go mod tidy` keeps its whole module graph.
package tools

import _ "k8s.io/kubernetes/cmd/kubectl"

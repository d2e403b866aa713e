//go:build tools

// Package tools pins the etcd server command as a dependency of this module.
package tools

import _ "go.etcd.io/etcd/server/v3"

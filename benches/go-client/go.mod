// The API server's own HTTP/2 client (Go's net/http, which bundles
// golang.org/x/net/http2), driving a webhook at a fixed rate on one
// connection: how the server_load bench checks what latency kube-apiserver
// sees. Standard library only: builds with no module downloads.
module statusguard.dev/benches/go-client

go 1.26.0

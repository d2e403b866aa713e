// Command go-client posts one request body to a webhook URL at a fixed
// rate over a single HTTP/2 connection, one request per stream, as
// kube-apiserver calls an admission webhook, for a fixed time.
//
// It writes a log of one line per request (start µs, HTTP status, duration
// µs, tab-separated) and prints its counts in h2load's "requests:" format,
// so that the server_load bench reads it as it reads h2load.
//
//	go-client -url https://127.0.0.1:8443/validate -body review.json -rate 1000 -seconds 10 -log out.log [-cert client.crt -key client.key]
package main

import (
	"bytes"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"
)

type result struct {
	start    time.Duration
	status   int
	duration time.Duration
}

func main() {
	url := flag.String("url", "", "the webhook URL (https)")
	bodyFile := flag.String("body", "", "the request body")
	rate := flag.Int("rate", 1000, "requests per second")
	seconds := flag.Int("seconds", 10, "how long to send")
	logFile := flag.String("log", "", "where to write one line per request")
	certFile := flag.String("cert", "", "a client certificate to present (PEM; with -key), as the API server does to a server with --client-ca-file")
	keyFile := flag.String("key", "", "the client certificate's key (PEM)")
	flag.Parse()
	body, err := os.ReadFile(*bodyFile)
	if err != nil || *url == "" || *logFile == "" || *rate <= 0 {
		fmt.Fprintln(os.Stderr, "usage: go-client -url URL -body FILE -rate N -seconds N -log FILE:", err)
		os.Exit(2)
	}
	// As the API server's webhook client: HTTP/2 over TLS, one connection.
	// The bench's certificate is self-signed for the loopback address only.
	tlsConfig := &tls.Config{InsecureSkipVerify: true}
	if *certFile != "" {
		pair, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "cannot load the client certificate:", err)
			os.Exit(2)
		}
		tlsConfig.Certificates = []tls.Certificate{pair}
	}
	transport := &http.Transport{
		TLSClientConfig:   tlsConfig,
		ForceAttemptHTTP2: true,
		MaxConnsPerHost:   1,
	}
	client := &http.Client{Transport: transport, Timeout: 10 * time.Second}

	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
	)
	send := func(began time.Time, at time.Duration) {
		defer wg.Done()
		request, _ := http.NewRequest(http.MethodPost, *url, bytes.NewReader(body))
		request.Header.Set("Content-Type", "application/json")
		status := 0
		response, err := client.Do(request)
		if err == nil {
			_, _ = io.Copy(io.Discard, response.Body)
			response.Body.Close()
			status = response.StatusCode
			if response.ProtoMajor != 2 {
				fmt.Fprintln(os.Stderr, "the server answered over", response.Proto, "not HTTP/2")
				os.Exit(1)
			}
		}
		took := time.Since(began)
		mu.Lock()
		results = append(results, result{at, status, took})
		mu.Unlock()
	}

	// One warm-up request opens the connection.
	wg.Add(1)
	send(time.Now(), 0)
	results = results[:0]

	interval := time.Second / time.Duration(*rate)
	total := *rate * *seconds
	origin := time.Now()
	for i := 0; i < total; i++ {
		due := origin.Add(time.Duration(i) * interval)
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		wg.Add(1)
		go send(time.Now(), time.Since(origin))
	}
	wg.Wait()

	var log bytes.Buffer
	succeeded, failed := 0, 0
	for _, r := range results {
		if r.status >= 200 && r.status < 300 {
			succeeded++
		} else {
			failed++
		}
		fmt.Fprintf(&log, "%d\t%d\t%d\n", r.start.Microseconds(), r.status, r.duration.Microseconds())
	}
	if err := os.WriteFile(*logFile, log.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "cannot write the log:", err)
		os.Exit(1)
	}
	fmt.Printf("requests: %d total, %d started, %d done, %d succeeded, %d failed, 0 errored, 0 timeout\n",
		len(results), len(results), len(results), succeeded, failed)
}

//! The TLS accept loop: a connection at a time through rustls into hyper,
//! HTTP/1.1 or HTTP/2 as ALPN chose, each tracked for the graceful drain,
//! at most `max_connections` at once, each with its buffers bounded.
//!
//! A connection must bring its first request to the router within the
//! header timeout of being accepted (TLS handshake, protocol detection and
//! headers together), or it is told to close and, a second later, closed:
//! nothing before a request holds one of the `max_connections` slots for
//! longer.
//!
//! The drain closes a connection between requests. A new connection's first
//! request is served even when the drain started before hyper read it: the
//! caller sent it to a server that was still accepting. (hyper-util's
//! `GracefulShutdown` closes such a connection unanswered when the drain
//! reaches it before hyper has read which protocol it speaks.) A later
//! request on a kept-alive HTTP/1.1 connection whose head is still arriving
//! when the drain starts is closed unanswered, as by any HTTP/1.1 server;
//! during the shutdown delay every answer closes its connection, so that by
//! the drain the API server has no such connection left.

use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::service::{Service as _, service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::server::limits::{
    H1_MAX_BUF, H2_CONNECTION_WINDOW, H2_MAX_FRAME, H2_MAX_STREAMS, H2_NARROW_WINDOW, H2_STREAM_WINDOW,
    H2_VERIFIED_MAX_FRAME, H2_WIDE_CONNECTIONS, Limits, MAX_HEADER_BYTES,
};

/// Binds `addr` for the accept loop. The IPv6 wildcard `[::]` is bound dual
/// stack, IPv4 included, whatever the node's `net.ipv6.bindv6only` says: one
/// default serves IPv4, IPv6 and dual-stack clusters. On a node without IPv6
/// it falls back to `0.0.0.0`, so that default never keeps a pod from
/// starting.
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    match bind(addr) {
        Err(e) if addr.ip() == Ipv6Addr::UNSPECIFIED && no_ipv6(&e) => {
            let ipv4 = SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()));
            tracing::warn!(%addr, error = %e, listen = %ipv4, "no IPv6 on this node: listening on IPv4 only");
            bind(ipv4)
        }
        bound => bound,
    }
}

/// Errors that mean "this node has no IPv6", not "the port is taken".
fn no_ipv6(error: &io::Error) -> bool {
    !matches!(error.kind(), io::ErrorKind::AddrInUse | io::ErrorKind::PermissionDenied)
}

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(false)?;
    }
    // As tokio's own bind: a restarted server rebinds at once while the old
    // process's connections sit in TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// Limits of the accept loop.
#[derive(Debug, Clone, Copy)]
pub struct AcceptLimits {
    /// Time allowed from a connection's accept to its first request's
    /// headers, TLS handshake included, and (HTTP/1.1, hyper's own timer)
    /// from each answer to the next request's headers.
    pub header_read_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
}

impl AcceptLimits {
    /// The accept loop's share of the server's [`Limits`].
    pub fn of(limits: &Limits) -> Self {
        Self {
            header_read_timeout: limits.header_read_timeout,
            max_connections: limits.max_connections,
        }
    }
}

/// What a connection's HTTP/2 peer may send: its flow-control windows (how
/// much before the handlers read) and its largest frame.
#[derive(Debug, Clone, Copy)]
struct Http2Room {
    connection_window: u32,
    stream_window: u32,
    max_frame: u32,
}

/// For the first [`H2_WIDE_CONNECTIONS`] HTTP/2 connections at once.
const WIDE: Http2Room = Http2Room {
    connection_window: H2_CONNECTION_WINDOW,
    stream_window: H2_STREAM_WINDOW,
    max_frame: H2_MAX_FRAME,
};
/// For a wide connection whose client certificate the server verified
/// (`--client-ca-file`): the API server's, which then sends a review in one
/// frame.
const WIDE_VERIFIED: Http2Room = Http2Room {
    max_frame: H2_VERIFIED_MAX_FRAME,
    ..WIDE
};
/// For every other connection: the protocol's initial windows, no more than
/// HTTP/1.1 reads ahead, so that unread bytes stay bounded across
/// connections (see [`crate::server::limits`]).
const NARROW: Http2Room = Http2Room {
    connection_window: H2_NARROW_WINDOW,
    stream_window: H2_NARROW_WINDOW,
    max_frame: H2_MAX_FRAME,
};

/// The HTTP/1.1 and HTTP/2 connection builder, with every buffer bounded
/// (see [`crate::server::limits`]).
fn connection_builder(limits: AcceptLimits, room: Http2Room) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(H1_MAX_BUF)
        .max_headers(100);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .initial_connection_window_size(room.connection_window)
        .initial_stream_window_size(room.stream_window)
        .max_header_list_size(MAX_HEADER_BYTES)
        .max_frame_size(room.max_frame)
        // A peer that stops answering pings is gone: its connection goes too.
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    builder
}

/// The connections still open when the accept loop stopped.
#[derive(Debug)]
pub struct OpenConnections {
    /// `true` once the drain started; every connection holds a receiver.
    draining: watch::Sender<bool>,
}

impl OpenConnections {
    /// Asks every connection to close once its requests are answered, and
    /// resolves when all have closed.
    pub async fn drained(&self) {
        self.draining.send_replace(true);
        self.draining.closed().await;
    }
}

/// Accepts connections until `stop` resolves, then returns the connections
/// still open, for the caller to drain.
pub async fn serve_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    limits: AcceptLimits,
    stop: impl Future<Output = ()>,
) -> OpenConnections {
    let service = TowerToHyperService::new(router);
    let builders = Arc::new(Builders {
        wide: connection_builder(limits, WIDE),
        wide_verified: connection_builder(limits, WIDE_VERIFIED),
        narrow: connection_builder(limits, NARROW),
    });
    let (draining, drain_watch) = watch::channel(false);
    let connections = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let wide_windows = Arc::new(Semaphore::new(H2_WIDE_CONNECTIONS));

    tokio::pin!(stop);
    loop {
        // At the cap, nothing more is accepted until a connection ends:
        // the kernel's listen backlog holds the rest.
        let slot = tokio::select! {
            slot = connections.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut stop => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // Small responses go out at once: without this, Nagle's algorithm
        // and the client's delayed ACK can hold an answer for ~40 ms.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        let acceptor = acceptor.clone();
        let builders = builders.clone();
        let wide_windows = wide_windows.clone();
        let service = service.clone();
        // Taken before the task starts, so that the drain waits for it.
        let drain_watch = drain_watch.clone();
        let first_request_by = Instant::now() + limits.header_read_timeout;
        tokio::spawn(async move {
            let _slot = slot;
            // Plain HTTP, a stalled client, a bad certificate request or a
            // client that says nothing after the handshake ends here, before
            // any HTTP is read: never answered. (hyper's own header timeout
            // starts only once hyper-util has told which protocol it is.)
            let first_byte = async {
                let tls = acceptor.accept(tcp).await?;
                let mut tls = BufReader::with_capacity(FIRST_READ, tls);
                tls.fill_buf().await?;
                Ok::<_, io::Error>(tls)
            };
            let tls = match tokio::time::timeout_at(first_request_by, first_byte).await {
                Ok(Ok(tls)) if !tls.buffer().is_empty() => tls,
                Ok(Ok(_)) => return,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake or first read failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "no TLS handshake or no request in time");
                    return;
                }
            };
            // A connection that chose HTTP/2 in its handshake gets wide
            // windows while there are some left, held until it ends. HTTP/1.1
            // needs none, and HTTP/2 without ALPN (prior knowledge) gets
            // narrow ones, as any connection past the wide ones. Large frames
            // only for a caller whose certificate was verified: h2 holds a
            // frame whole until it has arrived, and keeps a small DATA frame
            // as a slice of the buffer a large one came in (README, "small
            // HTTP/2 DATA frames").
            let session = tls.get_ref().get_ref().1;
            let http2 = session.alpn_protocol() == Some(b"h2");
            let verified = session.peer_certificates().is_some();
            let wide = http2.then(|| wide_windows.try_acquire_owned().ok()).flatten();
            let builder = match wide {
                Some(_) if verified => &builders.wide_verified,
                Some(_) => &builders.wide,
                None => &builders.narrow,
            };
            if let Err(e) = serve_connection(builder, TokioIo::new(tls), service, first_request_by, drain_watch).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(wide);
        });
    }
    OpenConnections { draining }
}

/// How long a connection told to close for want of a first request has to
/// go: enough for an HTTP/2 client to answer the GOAWAY's ping.
const CLOSING_GRACE: Duration = Duration::from_secs(1);

/// Serves one connection until it ends.
///
/// Until its first request reaches the router the connection is only
/// served: at `first_request_by` it is told to close (hyper-util's protocol
/// detection has no timer of its own, and HTTP/2 none for a first request)
/// and cut [`CLOSING_GRACE`] later, and a drain waits for it. After that,
/// once `draining` turns true (or the server is gone), hyper is told to
/// close it gracefully: HTTP/1.1 after the request in flight, HTTP/2 with a
/// GOAWAY that lets the streams the client already sent finish.
async fn serve_connection<I>(
    builder: &auto::Builder<TokioExecutor>,
    io: I,
    service: TowerToHyperService<Router>,
    first_request_by: Instant,
    mut draining: watch::Receiver<bool>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let first_request = Arc::new(Notify::new());
    let noted = first_request.clone();
    // One atomic operation per request: the permit stays until it is taken.
    let service = service_fn(move |request| {
        noted.notify_one();
        service.call(request)
    });
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let in_time = tokio::select! {
        // The connection first, so that a request already buffered reaches
        // the router before the deadline is looked at.
        biased;
        ended = connection.as_mut() => return ended,
        () = first_request.notified() => true,
        () = tokio::time::sleep_until(first_request_by) => false,
    };
    if !in_time {
        // Told, not cut: HTTP/2 gets a GOAWAY, so that a client that pooled
        // the connection unused (Go's does) dials anew instead of failing a
        // request on it, and a request that crossed the GOAWAY is answered.
        // Protocol detection is cancelled at once; an HTTP/1.1 head still
        // arriving gets the grace to finish.
        connection.as_mut().graceful_shutdown();
        tokio::select! {
            biased;
            ended = connection.as_mut() => return ended,
            () = first_request.notified() => return connection.await,
            () = tokio::time::sleep(CLOSING_GRACE) => {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no request within the header timeout").into());
            }
        }
    }
    tokio::select! {
        biased;
        ended = connection.as_mut() => return ended,
        // An error: the server is gone; closing is right then too.
        _ = draining.wait_for(|draining| *draining) => {}
    }
    connection.as_mut().graceful_shutdown();
    connection.await
}

/// The connection builders, by what a connection gets (see [`Http2Room`]).
struct Builders {
    wide: auto::Builder<TokioExecutor>,
    wide_verified: auto::Builder<TokioExecutor>,
    narrow: auto::Builder<TokioExecutor>,
}

/// The buffer of a connection's first read. hyper reads into its own
/// buffer once this one is drained: reads as large as it bypass it.
const FIRST_READ: usize = 8 * 1024;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::Router;
    use axum::routing::post;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::service::TowerToHyperService;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream};
    use tokio::sync::watch;
    use tokio::time::Instant;

    use super::{AcceptLimits, CLOSING_GRACE, NARROW, OpenConnections, connection_builder, serve_connection};

    const HEAD: &[u8] = b"POST /review HTTP/1.1\r\nhost: localhost\r\ncontent-length: 10\r\n\r\n";

    /// A connection served over an in-memory pipe, with the drain under the
    /// test's control; returns the client's end and whether the connection
    /// ended without an error.
    fn served(
        draining: watch::Receiver<bool>,
        first_request_within: Duration,
    ) -> (DuplexStream, tokio::task::JoinHandle<bool>) {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let router = Router::new().route(
            "/review",
            post(|body: String| async move { format!("read {}", body.len()) }),
        );
        // hyper's own header timeout far beyond the test's deadlines.
        let limits = AcceptLimits {
            header_read_timeout: Duration::from_secs(60),
            max_connections: 1,
        };
        let first_request_by = Instant::now() + first_request_within;
        let ended = tokio::spawn(async move {
            let builder = connection_builder(limits, NARROW);
            let service = TowerToHyperService::new(router);
            serve_connection(&builder, TokioIo::new(server), service, first_request_by, draining)
                .await
                .is_ok()
        });
        (client, ended)
    }

    /// What the server sent until it closed the connection.
    async fn answer(client: &mut DuplexStream) -> String {
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut answer)).await;
        assert!(read.is_ok(), "the connection was not closed");
        String::from_utf8_lossy(&answer).into_owned()
    }

    /// One request on a kept-alive connection, answered.
    async fn exchange(client: &mut DuplexStream) {
        client.write_all(HEAD).await.unwrap();
        client.write_all(b"0123456789").await.unwrap();
        let mut answer = vec![0; 4096];
        let read = client.read(&mut answer).await.unwrap();
        let answer = String::from_utf8_lossy(&answer[..read]);
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("read 10"),
            "{answer}"
        );
    }

    /// A whole request sent in two parts, `split` bytes first, on a
    /// connection whose drain started before it was accepted; what the
    /// server answered.
    async fn sent_in_two_parts_while_draining(split: usize) -> String {
        let (_drain, draining) = watch::channel(true);
        let (mut client, ended) = served(draining, Duration::from_secs(5));
        let request = [HEAD, b"0123456789"].concat();
        let (first, second) = request.split_at(split);
        client.write_all(first).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        client.write_all(second).await.unwrap();
        let answer = answer(&mut client).await;
        assert!(ended.await.unwrap());
        answer
    }

    /// The failure of stop 45's CI: a request sent before SIGTERM, whose
    /// connection hyper had not read when the drain started, was closed
    /// unanswered (the client's next write: broken pipe).
    #[tokio::test]
    async fn a_request_sent_before_the_drain_but_not_yet_read_is_answered() {
        let answer = sent_in_two_parts_while_draining(HEAD.len() + 5).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("read 10"), "{answer}");
    }

    /// A caller that was still sending the first request's head when the
    /// drain started gets its answer too. One byte, "P", cannot yet tell
    /// HTTP/1.1's "POST" from HTTP/2's "PRI" preface: hyper-util's protocol
    /// detection, told to shut down then, would drop the connection.
    #[tokio::test]
    async fn a_first_request_whose_head_arrives_during_the_drain_is_answered() {
        let answer = sent_in_two_parts_while_draining(1).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    /// Between requests the drain closes the connection at once, and the
    /// drain is over when the last connection is: a keep-alive connection
    /// does not hold it to its timeout.
    #[tokio::test]
    async fn an_idle_connection_closes_when_the_drain_starts_and_the_drain_ends_with_it() {
        let (draining, watch) = watch::channel(false);
        let (mut client, ended) = served(watch, Duration::from_secs(5));
        exchange(&mut client).await;
        let open = OpenConnections { draining };
        let drained = tokio::time::timeout(Duration::from_secs(2), open.drained()).await;
        assert!(drained.is_ok(), "the drain waited for an idle connection");
        assert!(ended.await.unwrap());
        assert_eq!(answer(&mut client).await, "", "closed with nothing more sent");
    }

    /// A connection that stalls before its first request reaches the router
    /// is closed at the deadline (an HTTP/1.1 head still arriving, after the
    /// grace), also in the middle of protocol detection (one byte of a
    /// possible HTTP/2 preface), which has no timer of its own.
    #[tokio::test]
    async fn a_connection_without_a_first_request_in_time_is_closed() {
        for stalled_after in [&b"P"[..], b"PRI * HTTP/2.0\r\n", b"POST /review HTTP/1.1\r\n"] {
            let (_drain, draining) = watch::channel(false);
            let started = Instant::now();
            let (mut client, ended) = served(draining, Duration::from_millis(200));
            client.write_all(stalled_after).await.unwrap();
            assert_eq!(answer(&mut client).await, "", "{stalled_after:?}");
            assert!(
                started.elapsed() >= Duration::from_millis(200),
                "closed before the deadline"
            );
            assert!(!ended.await.unwrap(), "ended with an error");
        }
    }

    /// The first request's headers are what must come in time: its body
    /// may come after the deadline and its grace.
    #[tokio::test]
    async fn a_first_request_whose_body_comes_after_the_deadline_is_answered() {
        let (_drain, draining) = watch::channel(false);
        let (mut client, ended) = served(draining, Duration::from_millis(100));
        client.write_all(HEAD).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100) + CLOSING_GRACE + Duration::from_millis(200)).await;
        client.write_all(b"0123456789").await.unwrap();
        let mut answer = vec![0; 4096];
        let read = client.read(&mut answer).await.unwrap();
        let answer = String::from_utf8_lossy(&answer[..read]);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(!ended.is_finished());
    }

    /// An HTTP/2 client's connection: its request sender, and its driver,
    /// which ends when the server closes the connection.
    async fn http2_client(
        io: DuplexStream,
    ) -> (
        hyper::client::conn::http2::SendRequest<String>,
        tokio::task::JoinHandle<hyper::Result<()>>,
    ) {
        let (send, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .unwrap();
        (send, tokio::spawn(connection))
    }

    async fn http2_review(send: &mut hyper::client::conn::http2::SendRequest<String>) -> u16 {
        let request = hyper::Request::post("http://localhost/review")
            .body("0123456789".to_owned())
            .unwrap();
        send.send_request(request).await.unwrap().status().as_u16()
    }

    /// An HTTP/2 connection that sends no request in time (a client's pool
    /// may hold one unused) is told to go with a GOAWAY, and closes cleanly,
    /// rather than being cut under a request the client may be sending.
    #[tokio::test]
    async fn an_http2_connection_without_a_request_in_time_is_told_to_go() {
        let (_drain, draining) = watch::channel(false);
        let (client, ended) = served(draining, Duration::from_millis(200));
        let (send, driver) = http2_client(client).await;
        // Cut without a GOAWAY, the client's driver ends with a broken pipe.
        let closed = tokio::time::timeout(Duration::from_secs(3), driver).await;
        assert!(matches!(closed, Ok(Ok(Ok(())))), "{closed:?}");
        assert!(send.is_closed());
        // The server's side may end with a broken pipe of its own: the
        // client closes on the GOAWAY while the server still writes.
        assert!(tokio::time::timeout(Duration::from_secs(1), ended).await.is_ok());
    }

    /// An HTTP/2 connection whose first request came in time is served
    /// past the deadline and its grace.
    #[tokio::test]
    async fn an_http2_connection_with_a_request_in_time_is_served_past_the_deadline() {
        let (_drain, draining) = watch::channel(false);
        let (client, ended) = served(draining, Duration::from_millis(100));
        let (mut send, _driver) = http2_client(client).await;
        assert_eq!(http2_review(&mut send).await, 200);
        tokio::time::sleep(Duration::from_millis(100) + CLOSING_GRACE + Duration::from_millis(200)).await;
        assert_eq!(http2_review(&mut send).await, 200);
        assert!(!ended.is_finished());
    }

    /// The deadline is for the first request only: a connection that
    /// brought one in time is served past it.
    #[tokio::test]
    async fn a_connection_with_a_first_request_in_time_is_served_past_the_deadline() {
        let (_drain, draining) = watch::channel(false);
        let (mut client, ended) = served(draining, Duration::from_millis(100));
        exchange(&mut client).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        exchange(&mut client).await;
        assert!(!ended.is_finished());
    }
}

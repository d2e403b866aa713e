//! The TLS accept loop: a connection at a time through rustls into hyper,
//! HTTP/1.1 or HTTP/2 as ALPN chose, each tracked for the graceful drain,
//! at most `max_connections` at once, each with its buffers bounded.

use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
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
    /// Time allowed for a TLS handshake, the first byte of a request, and
    /// (HTTP/1.1) its headers.
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

/// Accepts connections until `stop` resolves, then returns the tracker of
/// the connections still open, for the caller to drain.
pub async fn serve_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    limits: AcceptLimits,
    stop: impl Future<Output = ()>,
) -> GracefulShutdown {
    let service = TowerToHyperService::new(router);
    let builders = Arc::new(Builders {
        wide: connection_builder(limits, WIDE),
        wide_verified: connection_builder(limits, WIDE_VERIFIED),
        narrow: connection_builder(limits, NARROW),
    });
    let graceful = GracefulShutdown::new();
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
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _slot = slot;
            // Plain HTTP, a stalled client, a bad certificate request or a
            // client that says nothing after the handshake ends here, before
            // any HTTP is read: never answered. (hyper's own header timeout
            // starts only at a request's first byte.)
            let first_byte = async {
                let tls = acceptor.accept(tcp).await?;
                let mut tls = BufReader::with_capacity(FIRST_READ, tls);
                tls.fill_buf().await?;
                Ok::<_, io::Error>(tls)
            };
            let tls = match tokio::time::timeout(limits.header_read_timeout, first_byte).await {
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
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(wide);
        });
    }
    graceful
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

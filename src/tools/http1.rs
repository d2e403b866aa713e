//! One HTTP/1.1 exchange on a connection the caller dialled (plain TCP, or
//! TLS it configured itself): what `probe` and `suggest --observed` need of
//! an HTTP client, on the hyper the server is built on.

use http_body_util::BodyExt as _;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

/// Sends `request` on `io` and reads the whole answer. The error says which
/// step failed.
pub(crate) async fn exchange<IO, B>(io: IO, request: Request<B>) -> Result<(StatusCode, Bytes), String>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake::<_, B>(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    tokio::spawn(connection);
    let response: hyper::Response<Incoming> = sender
        .send_request(request)
        .await
        .map_err(|e| format!("the request failed: {e}"))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("the answer could not be read: {e}"))?
        .to_bytes();
    Ok((status, body))
}

//! A TCP listener that bounds what a peer can hold: connections in total and per peer
//! address, a deadline for a connection's first request headers, and an idle timeout.
//!
//! Without these, anyone who can reach the port (no token needed) exhausts the router:
//! idle or slow-header sockets are never closed, and enough of them use up the process's
//! file descriptors, after which even `/healthz` stops answering. Here:
//!
//! - a connection over `max_connections`, or over `max_per_peer` from one IP address, is
//!   closed as soon as it is accepted (counted, and logged at most once a second);
//! - until the first request's headers are complete (`\r\n\r\n` read), the connection has
//!   `header_timeout` from its accept, however slowly bytes trickle in;
//! - after that, a connection with no byte read or written for `idle_timeout` is closed —
//!   WebSocket peers heartbeat or receive snapshots every few seconds, streamed answers
//!   write a frame per token, so only a silent socket hits it.
//!
//! `TCP_NODELAY` is set on every accepted socket (small SSE and NDJSON writes must not
//! wait for the peer's delayed ACK).
//!
//! With TLS ([`GuardedListener::with_tls`]) the handshake runs inside the stream, on the
//! connection's own task, on its first read or write: a slow or silent TLS client is held
//! to the same header deadline (the handshake is part of getting the headers), the accept
//! loop never waits on one peer, and the header scan sees the decrypted bytes.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;

/// What one listener admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub max_per_peer: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 4096,
            max_per_peer: 512,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// A listener enforcing [`Limits`]; serve it with `axum::serve`.
pub struct GuardedListener {
    inner: TcpListener,
    limits: Limits,
    counts: Arc<Mutex<Counts>>,
    refused: Arc<std::sync::atomic::AtomicU64>,
    last_warning: Option<Instant>,
    tls: Option<TlsAcceptor>,
}

impl GuardedListener {
    pub fn new(inner: TcpListener, limits: Limits) -> Self {
        GuardedListener {
            inner,
            limits,
            counts: Arc::default(),
            refused: Arc::default(),
            last_warning: None,
            tls: None,
        }
    }

    /// Serves TLS with `config` on every connection (https and wss), or plain TCP with
    /// `None`. A peer that speaks plain HTTP to a TLS listener fails its handshake and is
    /// closed.
    pub fn with_tls(mut self, config: Option<Arc<rustls::ServerConfig>>) -> Self {
        self.tls = config.map(TlsAcceptor::from);
        self
    }

    /// Connections refused so far (over a cap), shared for metrics.
    pub fn refused(&self) -> Arc<std::sync::atomic::AtomicU64> {
        Arc::clone(&self.refused)
    }

    fn admit(&self, ip: IpAddr) -> Option<Permit> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let mine = c.per_peer.get(&ip).copied().unwrap_or(0);
        if c.total >= self.limits.max_connections || mine >= self.limits.max_per_peer {
            return None;
        }
        c.total += 1;
        *c.per_peer.entry(ip).or_insert(0) += 1;
        Some(Permit {
            ip,
            counts: Arc::clone(&self.counts),
        })
    }
}

impl axum::serve::Listener for GuardedListener {
    type Io = GuardedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, addr) = match self.inner.accept().await {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            match self.admit(addr.ip()) {
                Some(permit) => {
                    let _ = stream.set_nodelay(true);
                    let conn = match &self.tls {
                        Some(acceptor) => Conn::Handshake(Box::new(acceptor.accept(stream))),
                        None => Conn::Plain(stream),
                    };
                    return (GuardedStream::new(conn, permit, self.limits), addr);
                }
                None => {
                    self.refused
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let now = Instant::now();
                    if self
                        .last_warning
                        .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
                    {
                        self.last_warning = Some(now);
                        tracing::warn!(
                            peer = %addr.ip(),
                            "connection refused: over the limit of {} connections in total or {} from one address",
                            self.limits.max_connections,
                            self.limits.max_per_peer
                        );
                    }
                    drop(stream);
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection's place in the counts, given back when the connection closes.
struct Permit {
    ip: IpAddr,
    counts: Arc<Mutex<Counts>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_peer.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_peer.remove(&self.ip);
            }
        }
    }
}

/// The bytes under a [`GuardedStream`]: plain TCP, or TLS before and after its handshake.
enum Conn {
    Plain(TcpStream),
    Handshake(Box<tokio_rustls::Accept<TcpStream>>),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// The handshake failed; every later read or write fails too.
    Failed,
}

/// What a [`Conn`] reads and writes once ready.
trait Io: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> Io for T {}

impl Conn {
    /// The stream to read or write, once a pending handshake is done.
    fn ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<&mut dyn Io>> {
        if let Conn::Handshake(accept) = self {
            match Pin::new(accept.as_mut()).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(tls)) => *self = Conn::Tls(Box::new(tls)),
                Poll::Ready(Err(e)) => {
                    *self = Conn::Failed;
                    return Poll::Ready(Err(e));
                }
            }
        }
        match self {
            Conn::Plain(s) => Poll::Ready(Ok(s)),
            Conn::Tls(s) => Poll::Ready(Ok(s.as_mut())),
            Conn::Handshake(_) | Conn::Failed => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the TLS handshake failed",
            ))),
        }
    }
}

/// A connection with its deadline: the headers' until they are read, then the idle one.
pub struct GuardedStream {
    inner: Conn,
    _permit: Permit,
    deadline: Pin<Box<Sleep>>,
    idle: Duration,
    /// How much of `\r\n\r\n` the bytes read so far end with; `None` once it was seen.
    header_match: Option<usize>,
}

const HEADER_END: &[u8] = b"\r\n\r\n";

impl GuardedStream {
    fn new(inner: Conn, permit: Permit, limits: Limits) -> Self {
        GuardedStream {
            inner,
            _permit: permit,
            deadline: Box::pin(tokio::time::sleep(limits.header_timeout)),
            idle: limits.idle_timeout,
            header_match: Some(0),
        }
    }

    fn touch(&mut self) {
        if self.header_match.is_none() {
            let at = tokio::time::Instant::now() + self.idle;
            self.deadline.as_mut().reset(at);
        }
    }

    fn scan(&mut self, bytes: &[u8]) {
        let Some(mut m) = self.header_match else {
            return;
        };
        for b in bytes {
            m = if *b == HEADER_END[m] {
                m + 1
            } else if *b == HEADER_END[0] {
                1
            } else {
                0
            };
            if m == HEADER_END.len() {
                self.header_match = None;
                return;
            }
        }
        self.header_match = Some(m);
    }

    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline.as_mut().poll(cx).is_ready()
    }
}

fn timed_out(headers: bool) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        if headers {
            "the request headers did not arrive in time"
        } else {
            "the connection was idle too long"
        },
    )
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = match this.inner.ready(cx) {
            Poll::Ready(Ok(io)) => Pin::new(io).poll_read(cx, buf),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        };
        match polled {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.scan(&buf.filled()[before..]);
                    this.touch();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.expired(cx) => {
                Poll::Ready(Err(timed_out(this.header_match.is_some())))
            }
            other => other,
        }
    }
}

impl GuardedStream {
    /// A write's result: bytes written count as activity; a write the peer does not
    /// take before the deadline fails the connection.
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match r {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.touch();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.expired(cx) => {
                Poll::Ready(Err(timed_out(self.header_match.is_some())))
            }
            other => other,
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = match this.inner.ready(cx) {
            Poll::Ready(Ok(io)) => Pin::new(io).poll_write(cx, buf),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        };
        this.wrote(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = match this.inner.ready(cx) {
            Poll::Ready(Ok(io)) => Pin::new(io).poll_write_vectored(cx, bufs),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        };
        this.wrote(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        match &self.inner {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
            Conn::Handshake(_) | Conn::Failed => false,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Conn::Handshake(_) | Conn::Failed => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Conn::Handshake(_) | Conn::Failed => Poll::Ready(Ok(())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair(limits: Limits) -> (GuardedListener, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        (GuardedListener::new(l, limits), addr)
    }

    #[tokio::test]
    async fn slow_headers_time_out_and_complete_ones_go_idle() {
        use axum::serve::Listener;
        let limits = Limits {
            header_timeout: Duration::from_millis(200),
            idle_timeout: Duration::from_millis(600),
            ..Limits::default()
        };
        let (mut l, addr) = pair(limits).await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        let (mut io, _) = l.accept().await;
        slow.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let mut buf = [0u8; 64];
        // The stream itself must end the read; the outer timeout only keeps a broken
        // deadline from hanging the test.
        let read_until_error = async {
            loop {
                if let Err(e) = io.read(&mut buf).await {
                    return e;
                }
            }
        };
        let e = tokio::time::timeout(Duration::from_secs(10), read_until_error)
            .await
            .expect("the header deadline never fired");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("headers"), "{e}");

        let mut ok = TcpStream::connect(addr).await.unwrap();
        let (mut io, _) = l.accept().await;
        ok.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let n = io.read(&mut buf).await.unwrap();
        assert_eq!(n, 27);
        // Past the header deadline, within the idle one: still open; then idle.
        tokio::time::sleep(Duration::from_millis(300)).await;
        io.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        let e = tokio::time::timeout(Duration::from_secs(10), io.read(&mut buf))
            .await
            .expect("the idle deadline never fired")
            .unwrap_err();
        assert!(e.to_string().contains("idle"), "{e}");
    }

    #[tokio::test]
    async fn connections_over_the_per_peer_cap_are_closed_and_freed_on_close() {
        use axum::serve::Listener;
        let limits = Limits {
            max_per_peer: 2,
            ..Limits::default()
        };
        let (mut l, addr) = pair(limits).await;
        let refused = l.refused();
        let a = TcpStream::connect(addr).await.unwrap();
        let (ia, _) = l.accept().await;
        let _b = TcpStream::connect(addr).await.unwrap();
        let (_ib, _) = l.accept().await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        // The third is refused: accept keeps waiting, and c sees the close.
        let accept = tokio::time::timeout(Duration::from_millis(200), l.accept()).await;
        assert!(
            accept.is_err(),
            "a third connection from one address was admitted"
        );
        let mut buf = [0u8; 1];
        assert_eq!(c.read(&mut buf).await.unwrap_or(0), 0);
        assert_eq!(refused.load(std::sync::atomic::Ordering::Relaxed), 1);
        drop((a, ia));
        let _d = TcpStream::connect(addr).await.unwrap();
        let admitted = tokio::time::timeout(Duration::from_secs(2), l.accept()).await;
        assert!(
            admitted.is_ok(),
            "a closed connection's place was not freed"
        );
    }
}

//! An in-process stand-in for a den router's console side, on loopback: the console
//! feed (`GET /v1/console`, a WebSocket: the initial frames on connect, then whatever the
//! test pushes) and the Skulk-compatible `GET /node_id` and `GET /state` on the same
//! port. For console and recording tests that need a live router without the agents.
//!
//! ```no_run
//! # async fn f() -> std::io::Result<()> {
//! use den_tests::RouterStub;
//! let stub = RouterStub::start("router-node", "{}".into(), Vec::new()).await?;
//! // point the console at stub.url(), then stub.push(&frame) …
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use futures_util::SinkExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

use den_protocol::feed::{self, FeedMessage};

/// Placeholder in a `/state` body replaced by the request's `Authorization` header
/// (to test that echoed credentials never reach a recording).
pub const ECHO_AUTHORIZATION: &str = "{{authorization}}";

#[derive(Debug, Clone)]
struct Replies {
    node_id: String,
    state_status: u16,
    state_body: String,
}

/// A running stub (stopped when dropped).
pub struct RouterStub {
    pub addr: SocketAddr,
    frames: broadcast::Sender<String>,
    initial: Arc<Mutex<Vec<String>>>,
    replies: Arc<Mutex<Replies>>,
    task: JoinHandle<()>,
}

impl RouterStub {
    /// Start on a free loopback port. `initial` frames (typically `hello` and a
    /// `snapshot`) are sent to every feed client on connect.
    pub async fn start(
        node_id: &str,
        state_json: String,
        initial: Vec<FeedMessage>,
    ) -> std::io::Result<RouterStub> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (frames, _) = broadcast::channel(4096);
        let initial = Arc::new(Mutex::new(initial.iter().map(feed::encode).collect()));
        let replies = Arc::new(Mutex::new(Replies {
            node_id: serde_json::to_string(node_id).unwrap_or_default(),
            state_status: 200,
            state_body: state_json,
        }));
        let task = tokio::spawn(serve(
            listener,
            frames.clone(),
            initial.clone(),
            replies.clone(),
        ));
        Ok(RouterStub {
            addr,
            frames,
            initial,
            replies,
            task,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Send a frame to every connected feed client.
    pub fn push(&self, msg: &FeedMessage) {
        let _ = self.frames.send(feed::encode(msg));
    }

    /// Feed clients connected now.
    pub fn clients(&self) -> usize {
        self.frames.receiver_count()
    }

    /// Frames sent to clients that connect from now on.
    pub fn set_initial(&self, frames: Vec<FeedMessage>) {
        *lock(&self.initial) = frames.iter().map(feed::encode).collect();
    }

    /// What `GET /state` answers from now on (`{{authorization}}` in the body is
    /// replaced by the request's `Authorization` header).
    pub fn set_state(&self, status: u16, body: String) {
        let mut r = lock(&self.replies);
        r.state_status = status;
        r.state_body = body;
    }
}

impl Drop for RouterStub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Writers replace whole values: a poisoned lock still holds a consistent one.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn serve(
    listener: TcpListener,
    frames: broadcast::Sender<String>,
    initial: Arc<Mutex<Vec<String>>>,
    replies: Arc<Mutex<Replies>>,
) {
    while let Ok((stream, _)) = listener.accept().await {
        let frames = frames.subscribe();
        let initial = lock(&initial).clone();
        let replies = replies.clone();
        tokio::spawn(async move {
            let _ = connection(stream, frames, initial, replies).await;
        });
    }
}

async fn connection(
    mut stream: TcpStream,
    mut frames: broadcast::Receiver<String>,
    initial: Vec<String>,
    replies: Arc<Mutex<Replies>>,
) -> std::io::Result<()> {
    // Look at the request head without consuming it: a WebSocket upgrade is handed to
    // tungstenite whole.
    let mut buf = vec![0u8; 8192];
    let head = loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        let text = String::from_utf8_lossy(buf.get(..n).unwrap_or_default()).into_owned();
        if text.contains("\r\n\r\n") || n == buf.len() {
            break text;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    };
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
    if path.starts_with("/v1/console") {
        let mut ws = tokio_tungstenite::accept_async(stream)
            .await
            .map_err(std::io::Error::other)?;
        for frame in initial {
            ws.send(Message::text(frame))
                .await
                .map_err(std::io::Error::other)?;
        }
        while let Ok(frame) = frames.recv().await {
            if ws.send(Message::text(frame)).await.is_err() {
                break;
            }
        }
        return Ok(());
    }
    // Plain HTTP: consume the head, answer, close.
    let end = head.find("\r\n\r\n").map_or(head.len(), |i| i + 4);
    let mut consumed = vec![0u8; end];
    stream.read_exact(&mut consumed).await?;
    let authorization = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("authorization")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    let r = lock(&replies).clone();
    let (status, body) = match path.split('?').next().unwrap_or("") {
        "/node_id" => (200, r.node_id),
        "/state" => (
            r.state_status,
            r.state_body.replace(ECHO_AUTHORIZATION, &authorization),
        ),
        _ => (404, "{\"detail\":\"Not Found\"}".to_owned()),
    };
    let response = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

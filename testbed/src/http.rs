//! A tiny HTTP/1.1 file server on 127.0.0.1 for artifact downloads and for
//! pages a browser loads: each path answers with its body in one of the
//! ways a real server may (with a length, without one, failing once first,
//! with headers such as a content type or a Content-Security-Policy);
//! anything else is a 404.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How a path answers.
#[derive(Clone, Debug)]
pub enum Reply {
    /// 200 with a `content-length`.
    Body(Vec<u8>),
    /// 200 without a length: the body ends when the connection closes.
    Stream(Vec<u8>),
    /// A 503 the first time, then the body.
    FlakyOnce(Vec<u8>),
    /// 200 with a `content-length` and these headers besides (name, value):
    /// what a browser needs to see, a content type, a policy.
    WithHeaders {
        /// Sent as `name: value` lines, in this order.
        headers: Vec<(String, String)>,
        /// The body.
        body: Vec<u8>,
    },
}

impl Reply {
    /// An HTML page: `content-type: text/html; charset=utf-8`.
    pub fn html(body: &str) -> Reply {
        Reply::typed("text/html; charset=utf-8", body)
    }

    /// A script: `content-type: text/javascript; charset=utf-8`.
    pub fn javascript(body: &str) -> Reply {
        Reply::typed("text/javascript; charset=utf-8", body)
    }

    /// This reply with the header `name: value` added, for a page's
    /// `content-security-policy` say. A [`Reply::Body`] becomes a
    /// [`Reply::WithHeaders`]; the other kinds panic (they are for
    /// downloads, which need no headers).
    pub fn with_header(self, name: &str, value: &str) -> Reply {
        let (mut headers, body) = match self {
            Reply::WithHeaders { headers, body } => (headers, body),
            Reply::Body(body) => (Vec::new(), body),
            other => panic!("only Body and WithHeaders replies take headers, not {other:?}"),
        };
        headers.push((name.to_owned(), value.to_owned()));
        Reply::WithHeaders { headers, body }
    }

    fn typed(content_type: &str, body: &str) -> Reply {
        Reply::Body(body.as_bytes().to_vec()).with_header("content-type", content_type)
    }
}

type Routes = Arc<Mutex<HashMap<String, Reply>>>;

/// Serves `routes` until the test ends; returns `http://127.0.0.1:PORT`.
/// Each connection is served on its own task, so that a client holding one
/// open without a request (a browser's preconnect) does not stall the rest.
pub async fn serve(routes: Vec<(&str, Reply)>) -> String {
    let routes: Routes = Arc::new(Mutex::new(
        routes.into_iter().map(|(p, r)| (p.to_owned(), r)).collect(),
    ));
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the file server");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(answer(socket, routes.clone()));
        }
    });
    format!("http://{addr}")
}

/// Reads one request's head from `socket`, writes the response its path
/// has in `routes` and closes the connection.
async fn answer(mut socket: TcpStream, routes: Routes) {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&request)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let _ = socket.write_all(&response(&routes, path)).await;
    let _ = socket.shutdown().await;
}

/// The bytes that answer a request for `path`; takes a [`Reply::FlakyOnce`]'s
/// one failure.
fn response(routes: &Routes, path: String) -> Vec<u8> {
    let mut routes = routes.lock().expect("the routes' lock");
    match routes.get(&path).cloned() {
        Some(Reply::Body(body)) => [head("200 OK", Some(body.len()), &[]), body].concat(),
        Some(Reply::Stream(body)) => [head("200 OK", None, &[]), body].concat(),
        Some(Reply::WithHeaders { headers, body }) => {
            [head("200 OK", Some(body.len()), &headers), body].concat()
        }
        Some(Reply::FlakyOnce(body)) => {
            routes.insert(path, Reply::Body(body));
            head("503 Service Unavailable", Some(0), &[])
        }
        None => head("404 Not Found", Some(0), &[]),
    }
}

/// A response's status line and headers, up to the blank line.
fn head(status: &str, len: Option<usize>, headers: &[(String, String)]) -> Vec<u8> {
    let mut text = format!("HTTP/1.1 {status}\r\n");
    if let Some(len) = len {
        text.push_str(&format!("content-length: {len}\r\n"));
    }
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("connection: close\r\n\r\n");
    text.into_bytes()
}

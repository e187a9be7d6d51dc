//! A tiny HTTP/1.1 file server on 127.0.0.1 for artifact downloads: each
//! path answers with its body in one of the ways a real server may
//! (with a length, without one, failing once first); anything else is a
//! 404.

use std::collections::HashMap;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// How a path answers.
#[derive(Clone, Debug)]
pub enum Reply {
    /// 200 with a `content-length`.
    Body(Vec<u8>),
    /// 200 without a length: the body ends when the connection closes.
    Stream(Vec<u8>),
    /// A 503 the first time, then the body.
    FlakyOnce(Vec<u8>),
}

/// Serves `routes` until the test ends; returns `http://127.0.0.1:PORT`.
pub async fn serve(routes: Vec<(&str, Reply)>) -> String {
    let mut routes: HashMap<String, Reply> = routes.into_iter().map(|(p, r)| (p.to_owned(), r)).collect();
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the file server");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
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
            let head = |status: &str, len: Option<usize>| {
                let length = len
                    .map(|l| format!("content-length: {l}\r\n"))
                    .unwrap_or_default();
                format!("HTTP/1.1 {status}\r\n{length}connection: close\r\n\r\n").into_bytes()
            };
            let response = match routes.get(&path).cloned() {
                Some(Reply::Body(body)) => [head("200 OK", Some(body.len())), body].concat(),
                Some(Reply::Stream(body)) => [head("200 OK", None), body].concat(),
                Some(Reply::FlakyOnce(body)) => {
                    routes.insert(path, Reply::Body(body));
                    head("503 Service Unavailable", Some(0))
                }
                None => head("404 Not Found", Some(0)),
            };
            let _ = socket.write_all(&response).await;
            let _ = socket.shutdown().await;
        }
    });
    format!("http://{addr}")
}

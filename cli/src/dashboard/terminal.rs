//! A terminal on a task's page: xterm.js in the browser, a WebSocket to
//! this dashboard, and from here the same exec session `k8s4r exec -it`
//! opens, made with the user's own client (so the API server checks
//! `create` on `tasks/exec` and records the session as theirs).
//!
//! Between the browser and this process the messages are those of
//! Kubernetes' channel protocol: a binary message's first byte names its
//! channel. The browser may send stdin (0) and terminal sizes (4) only;
//! it gets stdout and stderr (1, 2). How the session ended comes as one
//! text message, `{"exit": N}` or `{"error": "..."}`, then the close.

use std::sync::Arc;

use axum::extract::{Path, Request, State as Extract};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use k8s4r_service::websocket::{ServerSocket, Upgrade};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

use super::State;
use crate::reach::{self, Target, RESIZE, STATUS, STDERR, STDIN, STDOUT};

/// The largest message a browser may send (a paste, a size): the API
/// session carries 32 KiB frames; a page has no need of more than this.
const MAX_MESSAGE: usize = 256 * 1024;
/// The command run when the page names none.
pub const DEFAULT_COMMAND: &str = "sh";

/// `GET /ns/{ns}/tasks/{name}/terminal`: a WebSocket from the task's page.
/// Its query is that of an exec: `command` (once per word), `width`,
/// `height`.
pub async fn terminal(
    Extract(state): Extract<Arc<State>>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    mut request: Request,
) -> Response {
    // A WebSocket is not held to the same-origin policy: any page the
    // user opens could try one. The browser always says whose page it is.
    if !super::guard::origin_is_dashboard(&state, &headers) {
        return refuse(
            StatusCode::FORBIDDEN,
            "a terminal opens only from the dashboard's own pages",
        );
    }
    let Some(upgrade) = Upgrade::of(&mut request) else {
        return refuse(StatusCode::BAD_REQUEST, "a terminal is a WebSocket");
    };
    let pairs = match exec_query(request.uri().query()) {
        Ok(pairs) => pairs,
        Err(why) => return refuse(StatusCode::BAD_REQUEST, &why),
    };
    let client = state.client.clone();
    let switching = upgrade.switching(None);
    tokio::spawn(async move {
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        let Ok(browser) = upgrade.socket(Some(config)).await else {
            return;
        };
        let target = Target::Task(name);
        let end = match reach::connect(&client, &target, &ns, "exec", &reach::query_of(&pairs)).await {
            Ok(session) => carry(browser, session).await,
            Err(error) => Ended::Error(format!("{error:#}"), browser),
        };
        end.tell().await;
    });
    switching
}

/// An exec's query from the page's: its command words (the default when
/// none), a size if given, always stdin and a terminal.
fn exec_query(query: Option<&str>) -> Result<Vec<(&'static str, String)>, String> {
    let mut command = Vec::new();
    let mut size = Vec::new();
    for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*key {
            "command" if !value.is_empty() => command.push(("command", value.into_owned())),
            "command" => {}
            "width" | "height" => {
                let n: u16 = value
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{key}={value:?} is not a terminal size"))?;
                size.push((if key == "width" { "width" } else { "height" }, n.to_string()));
            }
            other => {
                return Err(format!(
                    "a terminal takes command, width and height, not {other:?}"
                ))
            }
        }
    }
    if command.is_empty() {
        command.push(("command", DEFAULT_COMMAND.to_owned()));
    }
    command.push(("stdin", "true".into()));
    command.push(("tty", "true".into()));
    command.extend(size);
    Ok(command)
}

/// How a terminal ended, and the browser's socket to say it on.
enum Ended {
    /// The command's exit status.
    Exit(i32, ServerSocket),
    /// Why there is none.
    Error(String, ServerSocket),
    /// The page went away: nobody to tell.
    Left,
}

impl Ended {
    async fn tell(self) {
        let (said, mut browser) = match self {
            Ended::Exit(code, b) => (serde_json::json!({ "exit": code }), b),
            Ended::Error(why, b) => (serde_json::json!({ "error": why }), b),
            Ended::Left => return,
        };
        let _ = browser.send(Message::Text(said.to_string().into())).await;
        let _ = browser.close(None).await;
    }
}

/// Carries keys and sizes to the session and its output to the page until
/// either ends. The session ends with the page: closing the API
/// WebSocket hangs up the command on the robot.
async fn carry(mut browser: ServerSocket, session: reach::Ws) -> Ended {
    let (mut to_session, mut from_session) = session.split();
    loop {
        tokio::select! {
            message = browser.next() => match message {
                Some(Ok(Message::Binary(data))) => {
                    if !matches!(data.first(), Some(&STDIN | &RESIZE)) {
                        continue;
                    }
                    if to_session.send(Message::Binary(data)).await.is_err() {
                        let why = "the session's connection was lost".to_owned();
                        return Ended::Error(why, browser);
                    }
                }
                Some(Ok(Message::Close(_)) | Err(_)) | None => {
                    let _ = to_session.close().await;
                    return Ended::Left;
                }
                Some(Ok(_)) => {}
            },
            message = from_session.next() => {
                let early = "the session ended without the command's exit status (the robot or the server went away)";
                let (channel, body) = match reach::received(message, "session", early) {
                    Ok(Some(frame)) => frame,
                    Ok(None) => continue,
                    Err(error) => return Ended::Error(format!("{error:#}"), browser),
                };
                match channel {
                    STDOUT | STDERR => {
                        let mut out = Vec::with_capacity(body.len() + 1);
                        out.push(STDOUT);
                        out.extend_from_slice(&body);
                        if browser.send(Message::Binary(out.into())).await.is_err() {
                            let _ = to_session.close().await;
                            return Ended::Left;
                        }
                    }
                    STATUS => {
                        return match reach::exit_code_of(&body) {
                            Ok(code) => Ended::Exit(code, browser),
                            Err(error) => Ended::Error(format!("{error:#}"), browser),
                        };
                    }
                    _ => {}
                }
            }
        }
    }
}

fn refuse(status: StatusCode, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{message}\n"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::exec_query;

    #[test]
    fn the_page_query_becomes_an_interactive_exec() {
        let pairs = exec_query(Some("command=bash&command=-l&width=120&height=40")).unwrap();
        let expect: Vec<(&str, String)> = vec![
            ("command", "bash".into()),
            ("command", "-l".into()),
            ("stdin", "true".into()),
            ("tty", "true".into()),
            ("width", "120".into()),
            ("height", "40".into()),
        ];
        assert_eq!(pairs, expect);
        let pairs = exec_query(None).unwrap();
        assert_eq!(pairs[0], ("command", "sh".into()));
        assert!(exec_query(Some("width=0")).unwrap_err().contains("terminal size"));
        assert!(exec_query(Some("width=x")).is_err());
        // The page may not turn the terminal off or add what exec has not.
        assert!(exec_query(Some("tty=false")).unwrap_err().contains("tty"));
        assert!(exec_query(Some("stdin=false")).is_err());
    }
}

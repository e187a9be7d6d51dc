//! Who may talk to the dashboard. It acts with the user's credentials, so
//! every request must come from the user's own browser:
//!
//! - the Host header must name the dashboard (127.0.0.1, localhost or ::1
//!   and its port, or the address it listens on): a page of another site
//!   that rebinds its DNS name to 127.0.0.1 is refused;
//! - the printed URL carries a login token; the first request with it sets
//!   a cookie (HttpOnly, SameSite=Strict, per port) and every request
//!   after needs the cookie: another user of the machine cannot use the
//!   port;
//! - forms carry a second token (the CSRF token, only in pages the cookie
//!   opened), checked with the Origin header on every POST ([`form_ok`]);
//! - a WebSocket (a task's terminal) must name the dashboard as its
//!   Origin, as browsers always do ([`origin_is_dashboard`]);
//! - responses forbid framing, inline scripts, sniffing, caching and
//!   referrers to other sites (`same-origin`: with `no-referrer` a browser
//!   sends `Origin: null` on a form's POST, and the Origin check could not
//!   tell the dashboard's own forms from another site's). Inline styles
//!   are forbidden too, except on a page with a terminal ([`TERMINAL_CSP`]).

use std::sync::Arc;

use axum::extract::{Request, State as Extract};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::State;

const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";
/// The policy of a page with a terminal: xterm.js sizes and colours its
/// cells with `<style>` elements it writes, which `style-src 'self'`
/// refuses. Scripts stay the dashboard's own, and nothing may be loaded
/// from elsewhere, so an injected style has no way to send anything out.
pub const TERMINAL_CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                   img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
                   form-action 'self'";

/// The cookie of the dashboard on `port` (cookies are per host, not per
/// port: two dashboards must not share one).
pub fn cookie_name(port: u16) -> String {
    format!("k8s4r_dashboard_{port}")
}

/// Compares without leaking where they differ.
fn same(a: &str, b: &str) -> bool {
    bool::from(subtle::ConstantTimeEq::ct_eq(a.as_bytes(), b.as_bytes()))
}

/// The port in the Host header's allowed values.
fn port_of(state: &State) -> u16 {
    state
        .hosts
        .first()
        .and_then(|h| h.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

fn cookie_token<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn query_token(query: Option<&str>) -> Option<&str> {
    query?
        .split('&')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == "token")
        .map(|(_, v)| v)
}

/// The query without its `token`.
fn without_token(query: Option<&str>) -> String {
    let rest: Vec<&str> = query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("token="))
        .collect();
    if rest.is_empty() {
        String::new()
    } else {
        format!("?{}", rest.join("&"))
    }
}

fn refuse(status: StatusCode, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message.to_owned(),
    )
        .into_response()
}

/// Checks every request (see the module) and sets the headers every
/// response carries.
pub async fn guard(Extract(state): Extract<Arc<State>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if !state.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            "this dashboard answers only to its own address (127.0.0.1, localhost or [::1] and its port)",
        );
    }
    let cookie = cookie_name(port_of(&state));
    let uri = request.uri();
    if let Some(token) = query_token(uri.query()) {
        if !same(token, state.login_token()) {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "this login token is not this dashboard's",
            );
        }
        let location = format!("{}{}", uri.path(), without_token(uri.query()));
        let set = format!("{cookie}={token}; HttpOnly; SameSite=Strict; Path=/");
        let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response();
        if let Ok(v) = HeaderValue::from_str(&set) {
            response.headers_mut().insert(header::SET_COOKIE, v);
        }
        return secured(response);
    }
    let logged_in = cookie_token(headers, &cookie).is_some_and(|t| same(t, state.login_token()));
    if !logged_in {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "open the URL `k8s4r dashboard` (or `k8s4r up`) printed: it carries the login token",
        );
    }
    if request.method() == Method::POST && !origin_ok(&state, headers) {
        return refuse(StatusCode::FORBIDDEN, "a form of another site may not act here");
    }
    secured(next.run(request).await)
}

/// A POST's Origin, when the browser sends one, must be the dashboard.
fn origin_ok(state: &State, headers: &HeaderMap) -> bool {
    headers.get(header::ORIGIN).is_none() || origin_is_dashboard(state, headers)
}

/// Whether the request names its Origin and that is the dashboard (a
/// browser names it on every WebSocket).
pub fn origin_is_dashboard(state: &State, headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) else {
        return false;
    };
    let host = origin.strip_prefix("http://").unwrap_or("");
    state.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
}

/// Whether a submitted form carries this dashboard's CSRF token.
pub fn form_ok(state: &State, csrf: Option<&str>) -> bool {
    csrf.is_some_and(|c| same(c, state.csrf_token()))
}

fn secured(mut response: Response) -> Response {
    let h = response.headers_mut();
    // A page may set a policy of its own (a terminal's).
    h.entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(HeaderValue::from_static(CSP));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_read_from_the_query_and_the_cookie() {
        assert_eq!(query_token(Some("a=1&token=abc")), Some("abc"));
        assert_eq!(without_token(Some("a=1&token=abc&b=2")), "?a=1&b=2");
        assert_eq!(without_token(Some("token=abc")), "");
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("x=1; k8s4r_dashboard_8484=tok"),
        );
        assert_eq!(cookie_token(&headers, "k8s4r_dashboard_8484"), Some("tok"));
        assert_eq!(cookie_token(&headers, "k8s4r_dashboard_9"), None);
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }
}

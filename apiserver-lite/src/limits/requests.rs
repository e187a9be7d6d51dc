//! Admission of requests: which pool a request counts in, taking a slot of
//! it or answering 429, and holding the slot until the answer is sent.
//!
//! This is kube-apiserver's max-in-flight filter (`WithMaxInFlightLimit`):
//! it sorts requests by verb, leaves long-running ones (watches) out,
//! answers 429 with `Retry-After: 1` at once rather than queueing, and
//! serves `system:masters` even when the pool is full. The watch limit is
//! ours and works the same way.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Limiter;
use crate::authz::{Identity, ADMIN_GROUP};
use crate::error::ApiError;
use crate::http::request::{self, Verb};
use crate::http::App;

/// How long a client is told to wait before trying again, in seconds
/// (kube-apiserver's constant).
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// Which pool a request counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A watch (a `watch` verb, `?watch=true` lists among them): long-running,
    /// so it counts against the watch limits and not the in-flight ones.
    Watch,
    /// get, list and the discovery documents.
    ReadOnly,
    /// Everything else.
    Mutating,
}

/// Sorts a request the way kube-apiserver's filter does: by the verb its
/// request info names, and for a path that names nothing we serve, by its
/// method (`GET` reads, anything else counts as mutating).
pub fn classify(method: &Method, path: &str, query: &HashMap<String, String>) -> Kind {
    let info = request::parse(method, path, query).ok();
    // Reading logs, exec, attach, port-forward and proxy are long-running,
    // as kube-apiserver counts them.
    if let Some(request::Target::Resource(p)) = info.as_ref().map(|i| &i.target) {
        if matches!(
            p.subresource,
            Some("log" | "exec" | "attach" | "portforward" | "proxy")
        ) {
            return Kind::Watch;
        }
    }
    let verb = info.and_then(|info| info.verb);
    match verb {
        Some(Verb::Watch) => Kind::Watch,
        Some(Verb::Get | Verb::List) => Kind::ReadOnly,
        Some(_) => Kind::Mutating,
        None if method == Method::GET => Kind::ReadOnly,
        None => Kind::Mutating,
    }
}

/// The middleware in front of every request ([`crate::http::router`]):
/// sorts it, takes its slot or answers 429, and holds the slot until the
/// answer is sent. A request without valid credentials passes untouched,
/// for the handler to answer 401 (or a health check) before any limit, as
/// kube-apiserver authenticates before its limits.
pub async fn admit(State(app): State<App>, request: Request, next: Next) -> Response {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let Some(identity) = app.auth.authenticate(&app.store, authorization) else {
        return next.run(request).await;
    };
    let query: HashMap<String, String> = Query::try_from_uri(request.uri())
        .map(|q| q.0)
        .unwrap_or_default();
    let kind = classify(request.method(), request.uri().path(), &query);
    match app.limiter.admit(&identity, kind) {
        Ok(slot) => slot.hold_until_sent(next.run(request).await),
        Err(refused) => refused.into_response(),
    }
}

/// The slots a request holds; they are given back when it is dropped.
#[must_use = "the slot is given back as soon as it is dropped"]
pub struct Slot {
    permits: [Option<OwnedSemaphorePermit>; 2],
}

/// A pool with no slot left.
struct Full;

/// A request turned away: 429 with a `Retry-After` header and a `Status`
/// whose `details.retryAfterSeconds` says the same, as kube-apiserver's
/// `NewTooManyRequests` answers.
#[derive(Debug)]
pub struct Refused(pub ApiError);

impl Refused {
    fn new(message: String) -> Refused {
        Refused(
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", message)
                .with_details(json!({ "retryAfterSeconds": RETRY_AFTER_SECONDS })),
        )
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let mut response = self.0.into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        response
    }
}

/// A slot of `pool` (none to take when there is no pool); a privileged
/// request is served without one when the pool is full.
fn take(pool: Option<&Arc<Semaphore>>, privileged: bool) -> Result<Option<OwnedSemaphorePermit>, Full> {
    let Some(pool) = pool else { return Ok(None) };
    match pool.clone().try_acquire_owned() {
        Ok(permit) => Ok(Some(permit)),
        Err(_) if privileged => Ok(None),
        Err(_) => Err(Full),
    }
}

/// Whether kube-apiserver would serve this identity over a full pool.
fn privileged(identity: &Identity) -> bool {
    match identity {
        Identity::Admin => true,
        Identity::User(user) => user.groups.iter().any(|g| g == ADMIN_GROUP),
    }
}

impl Limiter {
    /// Takes the slots a request of `kind` needs, or answers 429.
    pub fn admit(&self, identity: &Identity, kind: Kind) -> Result<Slot, Refused> {
        let privileged = privileged(identity);
        let permits = match kind {
            Kind::ReadOnly => [
                take(self.read_only.as_ref(), privileged).map_err(|_| self.too_many())?,
                None,
            ],
            Kind::Mutating => [
                take(self.mutating.as_ref(), privileged).map_err(|_| self.too_many())?,
                None,
            ],
            Kind::Watch => {
                // The user's own limit first, so that a user at it takes
                // nothing from the others.
                let own = match identity {
                    Identity::User(user) => {
                        let pool = self.user_watches(&user.name);
                        take(Some(&pool), privileged).map_err(|_| {
                            self.refuse(format!(
                                "Too many watches by user {:?}: {} is the limit, please try again later.",
                                user.name, self.limits.max_watches_per_user
                            ))
                        })?
                    }
                    Identity::Admin => None,
                };
                let total = take(Some(&self.watches), privileged).map_err(|_| {
                    self.refuse(format!(
                        "Too many watches: {} is the limit, please try again later.",
                        self.limits.max_watches
                    ))
                })?;
                [own, total]
            }
        };
        Ok(Slot { permits })
    }

    fn too_many(&self) -> Refused {
        self.refuse("Too many requests, please try again later.".to_owned())
    }

    fn refuse(&self, message: String) -> Refused {
        self.rejected_requests.fetch_add(1, Ordering::Relaxed);
        Refused::new(message)
    }
}

impl Slot {
    /// Keeps the slot until `response`'s body has been handed to the
    /// connection, or the client has gone: for a watch, its whole life.
    pub fn hold_until_sent(self, response: Response) -> Response {
        if self.permits.iter().all(Option::is_none) {
            return response;
        }
        response.map(|body| Body::new(Held { body, _slot: self }))
    }
}

/// A response body that holds a slot until it is dropped.
struct Held {
    body: Body,
    _slot: Slot,
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    // Forwarded so that a body of known length keeps its Content-Length.
    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authz::User;
    use crate::limits::Limits;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn kind(method: Method, path: &str, pairs: &[(&str, &str)]) -> Kind {
        classify(&method, path, &query(pairs))
    }

    #[test]
    fn watches_are_long_running_whichever_way_they_are_asked_for() {
        let cms = "/api/v1/namespaces/default/configmaps";
        assert_eq!(kind(Method::GET, cms, &[("watch", "true")]), Kind::Watch);
        assert_eq!(kind(Method::GET, cms, &[("watch", "1")]), Kind::Watch);
        assert_eq!(
            kind(Method::GET, "/api/v1/watch/namespaces/default/configmaps", &[]),
            Kind::Watch
        );
        assert_eq!(
            kind(
                Method::GET,
                "/apis/test.k8s4r.io/v1/widgets",
                &[("watch", "true")]
            ),
            Kind::Watch
        );
        assert_eq!(kind(Method::GET, cms, &[("watch", "false")]), Kind::ReadOnly);
    }

    #[test]
    fn reads_and_discovery_are_not_mutating() {
        assert_eq!(
            kind(Method::GET, "/api/v1/namespaces/default/configmaps", &[]),
            Kind::ReadOnly
        );
        assert_eq!(
            kind(Method::GET, "/api/v1/namespaces/default/configmaps/a", &[]),
            Kind::ReadOnly
        );
        assert_eq!(kind(Method::GET, "/apis", &[]), Kind::ReadOnly);
        assert_eq!(kind(Method::GET, "/openapi/v3", &[]), Kind::ReadOnly);
        assert_eq!(kind(Method::GET, "/version", &[]), Kind::ReadOnly);
        // A path that names nothing is sorted by its method, as
        // kube-apiserver sorts a non-resource request.
        assert_eq!(kind(Method::GET, "/no/such/thing", &[]), Kind::ReadOnly);
    }

    #[test]
    fn writes_and_meaningless_methods_are_mutating() {
        let cms = "/api/v1/namespaces/default/configmaps";
        let one = "/api/v1/namespaces/default/configmaps/a";
        assert_eq!(kind(Method::POST, cms, &[]), Kind::Mutating);
        assert_eq!(kind(Method::PUT, one, &[]), Kind::Mutating);
        assert_eq!(kind(Method::PATCH, one, &[]), Kind::Mutating);
        assert_eq!(kind(Method::DELETE, one, &[]), Kind::Mutating);
        assert_eq!(kind(Method::DELETE, cms, &[]), Kind::Mutating);
        assert_eq!(
            kind(
                Method::POST,
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                &[]
            ),
            Kind::Mutating
        );
        // A PUT on a collection means nothing; it still counts as a write.
        assert_eq!(kind(Method::PUT, cms, &[]), Kind::Mutating);
        assert_eq!(kind(Method::POST, "/no/such/thing", &[]), Kind::Mutating);
    }

    fn user(name: &str) -> Identity {
        Identity::User(User::new(name, []))
    }

    fn limiter(read: usize, write: usize, watches: usize, per_user: usize) -> Limiter {
        Limiter::new(Limits {
            max_requests_inflight: read,
            max_mutating_requests_inflight: write,
            max_watches: watches,
            max_watches_per_user: per_user,
            ..Limits::default()
        })
    }

    #[test]
    fn a_full_pool_answers_429_with_retry_after_and_the_other_pool_is_separate() {
        let l = limiter(1, 1, 10, 10);
        let alice = user("alice");
        let read = l.admit(&alice, Kind::ReadOnly).unwrap();
        let Refused(e) = l.admit(&alice, Kind::ReadOnly).err().unwrap();
        assert_eq!(e.code.as_u16(), 429);
        assert_eq!(e.reason, "TooManyRequests");
        assert_eq!(e.message, "Too many requests, please try again later.");
        assert_eq!(e.to_status()["details"]["retryAfterSeconds"], 1);
        let answer = Refused(e).into_response();
        assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(answer.headers()[header::RETRY_AFTER], "1");
        let write = l.admit(&alice, Kind::Mutating).unwrap();
        assert!(l.admit(&alice, Kind::Mutating).is_err());
        // Watches are not in-flight requests.
        let watch = l.admit(&alice, Kind::Watch).unwrap();
        assert_eq!(l.usage().rejected_requests, 2);
        drop((read, write, watch));
        let _again = l.admit(&alice, Kind::ReadOnly).unwrap();
    }

    #[test]
    fn zero_inflight_is_unlimited() {
        let l = limiter(0, 0, 10, 10);
        let slots: Vec<Slot> = (0..1000)
            .map(|_| l.admit(&user("a"), Kind::Mutating).unwrap())
            .collect();
        assert_eq!(slots.len(), 1000);
        assert_eq!(l.usage().mutating, 0);
    }

    #[test]
    fn a_user_at_its_watch_limit_leaves_the_rest_to_others() {
        let l = limiter(10, 10, 3, 2);
        let (alice, bob) = (user("alice"), user("bob"));
        let _a1 = l.admit(&alice, Kind::Watch).unwrap();
        let _a2 = l.admit(&alice, Kind::Watch).unwrap();
        let Refused(e) = l.admit(&alice, Kind::Watch).err().unwrap();
        assert!(e.message.contains("\"alice\""), "{}", e.message);
        assert_eq!(l.usage().watches, 2, "a refused watch takes no slot of the total");
        let _b1 = l.admit(&bob, Kind::Watch).unwrap();
        let Refused(e) = l.admit(&bob, Kind::Watch).err().unwrap();
        assert!(e.message.starts_with("Too many watches: 3"), "{}", e.message);
    }

    #[test]
    fn system_masters_are_served_over_a_full_pool() {
        let l = limiter(1, 1, 1, 1);
        let admin_group = Identity::User(User::new("root", [ADMIN_GROUP.to_owned()]));
        for who in [Identity::Admin, admin_group] {
            let _held = l.admit(&user("alice"), Kind::ReadOnly);
            let _w = l.admit(&user("alice"), Kind::Watch);
            let extra: Vec<Slot> = (0..3).map(|_| l.admit(&who, Kind::ReadOnly).unwrap()).collect();
            let watches: Vec<Slot> = (0..3).map(|_| l.admit(&who, Kind::Watch).unwrap()).collect();
            assert_eq!((extra.len(), watches.len()), (3, 3));
        }
        assert_eq!(l.usage().rejected_requests, 0);
    }

    #[tokio::test]
    async fn a_slot_is_held_until_the_body_is_dropped_and_the_length_is_kept() {
        use http_body::Body as _;
        let l = limiter(1, 1, 1, 1);
        let slot = l.admit(&user("alice"), Kind::Watch).unwrap();
        let response = slot.hold_until_sent(Response::new(Body::from("hello")));
        assert_eq!(response.body().size_hint().exact(), Some(5));
        assert_eq!(l.usage().watches, 1);
        let bytes = axum::body::to_bytes(response.into_body(), 64).await.unwrap();
        assert_eq!(&bytes[..], b"hello");
        assert_eq!(l.usage().watches, 0);
    }
}

//! The HTTP face: every request is read once into a typed request
//! ([`request::parse`]), then authorized, then dispatched; each answer is
//! the one the real API server gives.
//!
//! ```text
//!   limits ──────── 429, in a middleware ahead of all this (crate::limits)
//!        │
//!   health check ── 200, before anything else
//!        │
//!   authenticate ── 401
//!   impersonate ─── 400 (a claim without a user), 403 (crate::impersonation)
//!   read the body ── 413
//!   parse ───────── a path that names nothing: authorize the path (403), 404
//!        ├─ discovery: authorize the path (403), GET only (405),
//!        │             serve the document (404)
//!        └─ resource: authorize what the path says (403), before
//!                     anything is looked up; resolve in the registry
//!                     (404), verb (405), dispatch to list, watch,
//!                     the verbs on objects, a ServiceAccount's token,
//!                     or a review's answer
//! ```

mod discovery;
mod list;
mod objects;
mod protobuf;
pub mod request;
mod response;
mod reviews;
mod token_request;
mod watch;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use self::request::{ResourcePath, Target, Verb};
use self::response::Shape;
use crate::authz::{Authenticator, Identity, PathAttributes};
use crate::error::ApiError;
use crate::limits::{self, Limiter};
use crate::resources::ResourceType;
use crate::store::Store;

/// Shared state of every request.
#[derive(Clone)]
pub struct App {
    pub store: Arc<Store>,
    /// The accepted bearer tokens and who they stand for.
    pub auth: Arc<Authenticator>,
    pub max_body: usize,
    pub bookmark_interval: Duration,
    pub shutdown: tokio_util::sync::CancellationToken,
    /// The in-flight and watch limits every request is admitted by.
    pub limiter: Arc<Limiter>,
    /// The client certificate aggregated APIs are called with.
    pub front: Arc<crate::aggregator::FrontProxy>,
    /// Where the services APIServices name listen.
    pub endpoints: Arc<crate::aggregator::Endpoints>,
    /// What paginated lists read on their first page, for the next ones.
    pub lists: Arc<list::ListSnapshots>,
}

pub fn router(app: App) -> axum::Router {
    axum::Router::new()
        .fallback(handle)
        .layer(axum::middleware::from_fn_with_state(app.clone(), limits::admit))
        .with_state(app)
}

type Query = HashMap<String, String>;

/// The subresource of a ServiceAccount that issues its tokens.
const TOKEN: &str = "token";

async fn handle(State(app): State<App>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    if matches!(path, "/healthz" | "/readyz" | "/livez") {
        return (StatusCode::OK, "ok").into_response();
    }
    let authorization = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let Some(requester) = app.auth.authenticate(&app.store, authorization) else {
        return ApiError::unauthorized().into_response();
    };
    let identity = match crate::impersonation::claim(&parts.headers).and_then(|claim| {
        app.store
            .read(|s| crate::impersonation::resolve(&app.auth, s, requester, claim))
    }) {
        Ok(identity) => identity,
        Err(e) => return e.into_response(),
    };
    let query: Query = axum::extract::Query::<Query>::try_from_uri(&parts.uri)
        .map(|q| q.0)
        .unwrap_or_default();
    // Bounded in time as well as size: a client that never finishes its
    // body would otherwise hold its in-flight slot for good.
    let limit = app.limiter.limits().body_read_timeout;
    let body = match tokio::time::timeout(limit, axum::body::to_bytes(body, app.max_body)).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return ApiError::too_large(app.max_body).into_response(),
        Err(_) => return ApiError::body_timeout(limit).into_response(),
    };
    let generation = app.store.generation();
    let mut response = route(&app, &identity, &parts, &query, body)
        .await
        .unwrap_or_else(IntoResponse::into_response);
    // Nothing leaves before it is on disk: not a write's answer, nor what
    // any answer (a read, a 403, discovery) saw of writes still on their way.
    if let Err(e) = app.store.settle(generation).await {
        response = ApiError::from(e).into_response();
    }
    protobuf::negotiate(&parts.headers, response).await
}

async fn route(
    app: &App,
    identity: &Identity,
    parts: &Parts,
    query: &Query,
    body: Bytes,
) -> Result<Response, ApiError> {
    // Authorization comes first, on what the request says, as in
    // kube-apiserver: a user who may not make a request learns nothing of
    // whether its path, resource, namespace or object exists.
    let method = parts.method.as_str().to_ascii_lowercase();
    let path_attrs = PathAttributes {
        verb: &method,
        path: parts.uri.path(),
    };
    let authorize_path = || {
        app.store
            .read(|s| app.auth.authorize_path(s, identity, &path_attrs))
    };
    let info = match request::parse(&parts.method, parts.uri.path(), query) {
        Ok(info) => info,
        Err(no_route) => {
            authorize_path()?;
            return Err(no_route);
        }
    };
    match info.target {
        Target::Discovery(doc) => {
            authorize_path()?;
            info.verb.ok_or_else(ApiError::method_not_allowed)?;
            discovery::serve(app, &doc, &parts.headers)
        }
        Target::Resource(path) => {
            let mut attrs = path.attributes(info.verb.unwrap_or(Verb::Get));
            if info.verb.is_none() {
                // A method that means nothing on this path: authorized as
                // the verb it would be, then refused.
                attrs.verb = rbac_verb(&parts.method);
            }
            app.store.read(|s| app.auth.authorize(s, identity, &attrs))?;
            let (rt, status) = match resolve(app, &path) {
                Ok(resolved) => resolved,
                Err(no_route) => {
                    // A group/version an APIService hands to its backend.
                    let backend = app
                        .store
                        .read(|s| crate::aggregator::backend(s, path.group, path.version));
                    let Some(backend) = backend else {
                        return Err(no_route);
                    };
                    info.verb.ok_or_else(ApiError::method_not_allowed)?;
                    return crate::aggregator::proxy(
                        &app.front,
                        &app.endpoints,
                        &backend,
                        identity,
                        parts,
                        body,
                    )
                    .await;
                }
            };
            let verb = info.verb.ok_or_else(ApiError::method_not_allowed)?;
            let call = Call {
                app,
                identity,
                path: &path,
                rt,
                status,
                shape: response::shape(&parts.headers),
                query,
                headers: &parts.headers,
                body,
            };
            call.dispatch(verb).await
        }
    }
}

/// The verb RBAC knows a method by on a resource path where it means
/// nothing (a PUT on a collection).
fn rbac_verb(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "get",
    }
}

/// The resource type a path is for, and whether it is for its status
/// subresource; 404 when the registry serves no such thing.
fn resolve(app: &App, path: &ResourcePath<'_>) -> Result<(Arc<ResourceType>, bool), ApiError> {
    let rt = app
        .store
        .read(|s| s.registry.get(path.group, path.version, path.resource))
        .ok_or_else(ApiError::no_route)?;
    if path.namespace.is_some() && !rt.namespaced {
        return Err(ApiError::no_route());
    }
    let status = match path.subresource {
        None => false,
        Some("status") if rt.status_subresource => true,
        Some(TOKEN) if rt.is_service_accounts() => false,
        Some(_) => return Err(ApiError::no_route()),
    };
    Ok((rt, status))
}

/// A request on a resource the registry serves, on its way through.
struct Call<'a> {
    app: &'a App,
    identity: &'a Identity,
    path: &'a ResourcePath<'a>,
    rt: Arc<ResourceType>,
    /// Whether the request is on the status subresource.
    status: bool,
    shape: Shape,
    query: &'a Query,
    headers: &'a HeaderMap,
    body: Bytes,
}

impl Call<'_> {
    fn authorize(&self, verb: Verb) -> Result<(), ApiError> {
        let attrs = self.path.attributes(verb);
        let app = self.app;
        app.store.read(|s| app.auth.authorize(s, self.identity, &attrs))
    }

    async fn dispatch(&self, verb: Verb) -> Result<Response, ApiError> {
        let (app, rt, ns, shape) = (self.app, &self.rt, self.path.namespace, self.shape);
        if self.path.subresource == Some(TOKEN) {
            return match (verb, self.path.name) {
                (Verb::Create, Some(name)) => token_request::create(self, name),
                _ => Err(ApiError::method_not_allowed()),
            };
        }
        if rt.review {
            return match (verb, self.path.name) {
                (Verb::Create, None) => reviews::create(self),
                _ => Err(ApiError::method_not_allowed()),
            };
        }
        if verb == Verb::Watch {
            // A watch of one object is a watch of its collection pinned to its name.
            let mut query = self.query.clone();
            if let Some(name) = self.path.name {
                query.insert("fieldSelector".into(), format!("metadata.name={name}"));
            }
            return watch::serve(app, rt.clone(), ns, &query, shape).await;
        }
        match (verb, self.path.name) {
            (Verb::List, None) => list::serve(app, rt, ns, self.query, shape),
            (Verb::Create, None) => objects::create(self).await,
            (Verb::DeleteCollection, None) => objects::delete_collection(self),
            (Verb::Get, Some(name)) => objects::get(self, name),
            (Verb::Update, Some(name)) => objects::update(self, name).await,
            (Verb::Patch, Some(name)) => objects::patch(self, name).await,
            (Verb::Delete, Some(name)) => objects::delete(self, name),
            // The verb already says whether a name comes with it; this only
            // keeps the match total.
            _ => Err(ApiError::method_not_allowed()),
        }
    }
}

//! An embedded, Kubernetes-compatible API server.
//!
//! It serves the subset of the Kubernetes API that kube-rs and kubectl rely
//! on, for a few built-in kinds and for any kind registered at run time by
//! creating a CustomResourceDefinition. See the README for what differs from
//! a real API server.
//!
//! ```no_run
//! # async fn demo() -> apiserver_lite::Result<()> {
//! let server = apiserver_lite::Config::for_tests().start().await?;
//! let client = server.client().await?;
//! # drop(client);
//! server.shutdown().await
//! # }
//! ```

pub mod admission;
pub mod aggregation;
pub mod aggregator;
pub mod authz;
pub mod bench;
pub mod cli;
pub mod crd;
pub mod default_roles;
pub mod error;
pub mod escalation;
pub mod event_conversion;
pub mod event_ttl;
pub mod fields;
pub mod gc;
pub mod http;
pub mod impersonation;
pub mod limits;
pub mod metadata;
pub mod object;
pub mod openapi;
pub mod ops;
pub mod persist;
pub mod private_files;
pub mod protobuf;
pub mod resources;
pub mod schema;
pub mod selectors;
pub mod server;
pub mod service_account_tokens;
pub mod store;
pub mod table;
pub mod tls;
pub mod user;

pub use authz::User;
pub use error::{ApiError, Error, Result};
pub use limits::Limits;
pub use server::{kubeconfig_yaml, start, write_kubeconfig, Config, RunningServer};

//! The API edge: everything between a caller's bytes and the domain.
//!
//! - [`grpc`]: the gRPC adapters of the `Planner` and `Coordinator` services;
//!   each converts the request, asks the domain and maps its error once.
//! - [`auth`]: who is calling (client certificates, bearer JWTs, static
//!   tokens) and the actor a call is recorded under.
//! - [`roles`]: the authenticated caller ([`roles::Principal`]) and the one
//!   table of which role each RPC needs.
//! - [`console`]: the operator console's page, served beside the API.
//! - [`admission`]: what one caller may take of the planner (rate, streams,
//!   connections).

pub mod admission;
pub mod auth;
pub mod console;
pub mod grpc;
pub mod idempotency;
pub mod roles;

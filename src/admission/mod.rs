//! Admission: an AdmissionReview read, decided and answered.
//!
//! Data flows one way, each step in its own module:
//! - [`wire`]: the one definition of the request statusguard reads
//!   ([`wire::ReviewRequest`]), and the response's encoding;
//! - `one_pass`: the fast reader, which projects each status while it reads
//!   the body, fuzz-checked against [`wire`] followed by [`project`]; it
//!   walks the body with `cursor`, which takes a value of the second object
//!   by comparing its bytes with the first's;
//! - [`project`]: the parts of a status the rules read, built from its text;
//! - [`decide`]: the pure decision, [`decide::decide`], on the request's head
//!   and the two projected statuses (it parses nothing);
//! - `trim`: the JSON Patch that restores other writers' items;
//! - [`answer`]: body to answer, the only reader of request bodies;
//! - [`observe`]: what a write changed, for the server's record of writers,
//!   from what the single pass read.
//!
//! For offline decisions: [`answer::answer`] answers a body as the server
//! does; [`answer::read_and_decide`] returns the request and the decision;
//! [`wire::parse_request`] with [`answer::decide_request`] is the two-pass
//! path the single pass is checked against.
//!
//! ```
//! use statusguard::admission::answer::answer;
//! use statusguard::admission::decide::Endpoint;
//!
//! let rules = statusguard::rules::RulesSource::Embedded.load_local().unwrap();
//! let sent = answer(Some(&rules), b"{not a review", Endpoint::Validate);
//! assert_eq!(sent.http_status, 400);
//! ```

pub mod answer;
mod cursor;
pub mod decide;
mod fingerprint;
mod managed_fields;
pub mod observe;
mod one_pass;
pub mod project;
mod skip;
mod trim;
pub mod wire;

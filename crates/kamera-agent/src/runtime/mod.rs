//! The runtime: a [`Session`] owns the model, the tiered chunk store, one kamera-sched window and
//! the model's live context, and executes the scheduler's plans through the `Backend` seam.

mod exec;
mod image;
mod no_reuse;
mod relevance;
mod session;
mod survivors;

pub use relevance::Relevance;
pub use session::{Applied, ApplyTimings, Session, SessionConfig, SessionStats};

//! The runtime: a [`Session`] owns the model, the tiered chunk store, one kamera-sched window and
//! the model's live context, and executes the scheduler's plans through the `Backend` seam.

mod encoder;
mod image;
mod relevance;
mod session;

pub use relevance::Relevance;
pub use session::{Applied, ApplyTimings, Session, SessionConfig, SessionStats};

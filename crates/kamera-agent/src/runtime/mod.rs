//! The runtime: a [`Session`] owns the model, the tiered chunk store, one kamera-sched window and
//! the model's live context, and executes the scheduler's plans through the `Backend` seam.

mod encoder;
mod image;
mod no_reuse;
pub(crate) mod pages;
pub(crate) mod prompt_rows;
pub(crate) mod relevance;
mod session;
mod towers;

pub use no_reuse::Reencoded;
pub use pages::{Block, CHUNK_TOKENS_MAX, ObservedPage, split_page};
pub use prompt_rows::PROMPT_ROWS_TOKENS;
pub use relevance::Relevance;
pub use session::{Applied, ApplyTimings, Session, SessionConfig, SessionStats};
pub use towers::{TOWER_CACHE_BYTES, TowerCache};

//! kamera-fuzz: seeded structured mutation of real seed files through every decoder of Kamera,
//! counted, on stable Rust. Each input must decode or fail with a clear error: no panic, no
//! allocation past the target's stated bound, and invariants on what decodes (re-encoding is exact).
//!
//! ```
//! use kamera_fuzz::{Runner, targets};
//! let target = targets::by_name("scenario")?;
//! let report = Runner::new(7).run(&target, 200);
//! assert_eq!(report.inputs, 200);
//! assert!(report.held(), "{report}");
//! # Ok::<(), kamera_fuzz::Error>(())
//! ```

mod alloc;
mod error;
mod mutate;
mod run;
pub mod targets;

pub use alloc::{CountingAlloc, measure};
pub use error::{Error, Result};
pub use mutate::Mutator;
pub use run::{Failure, Report, Runner};
pub use targets::{Outcome, Target};

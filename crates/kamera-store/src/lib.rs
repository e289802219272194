//! kamera-store: the canonical store of Kamera. Canonical KV (a chunk prefilled alone at 0),
//! conditioning patches and orbit patches, content-addressed by blake3 ids, in a sled database
//! on disk with a memory tier in front, and optionally Redis behind it for a fleet
//! ([`RedisStore`], tiered with [`Layered`]). Records use our own versioned, checksummed encoding
//! (see the README), so a damaged, foreign-model or future-format record is a typed, counted
//! miss and never served as KV.
//!
//! ```
//! use kamera_ops::{ChunkKv, DType, KvLayout};
//! use kamera_store::{ChunkId, ChunkStore, Key, ModelFp, Record, SledStore, StoreConfig};
//! let dir = std::env::temp_dir().join(format!("kamera-store-doctest-{}", std::process::id()));
//! let store = SledStore::open(StoreConfig::at(&dir))?;
//! let model = ModelFp::of("smollm2-135m:abcd");
//! let id = ChunkId::of(b"<screenshot bytes>", "siglip:1", model);
//! let kv = ChunkKv::zeros(KvLayout::gqa(2, 4, 2, 8), 0, 3, DType::Bf16).unwrap();
//! store.put(&Key::canonical(model, id), Record::kv(model, 1500, kv.clone()))?;
//! store.flush()?;
//! let back = store.lookup(&Key::canonical(model, id))?.expect("stored");
//! assert_eq!(back.as_kv(), Some(&kv));
//! # drop(store); let _ = std::fs::remove_dir_all(&dir);
//! # Ok::<(), kamera_store::Error>(())
//! ```

pub mod codec;
mod error;
mod id;
mod layered;
mod record;
mod redis_admin;
mod redis_conn;
mod redis_manifest;
mod redis_store;
mod report;
mod sled_store;
mod stack;
mod store;
mod tier;

pub use error::{Error, Result};
pub use id::{ChunkId, KEY_LEN, Key, Kind, ModelFp};
pub use layered::Layered;
pub use record::{Body, Record};
pub use redis_admin::ServerMemory;
pub use redis_store::{RedisConfig, RedisStore};
pub use report::{GcReport, Usage, UsageRow, VerifyReport};
pub use sled_store::{Meta, SledStore, StoreConfig, default_path};
pub use stack::{StackOptions, open_stack, open_stack_with};
pub use store::{ChunkStore, EvictionPolicy, Stats};
pub use tier::{MemStore, Tiered};

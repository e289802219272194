//! The store a runtime opens: a memory tier over the sled store on disk (f32 kept exact), and
//! over a fleet's Redis when a URL is given (memory -> sled -> Redis).

use std::path::Path;
use std::sync::Arc;

use crate::error::Result;
use crate::{ChunkStore, EvictionPolicy, Layered, RedisConfig, RedisStore, SledStore, StoreConfig, Tiered};

/// Opens the runtime's store stack at `path`, with `memory_bytes` of decoded records in memory.
pub fn open_stack(path: &Path, redis_url: Option<&str>, memory_bytes: u64) -> Result<Arc<dyn ChunkStore>> {
    let mut cfg = StoreConfig::at(path);
    cfg.dtype = None;
    let sled = SledStore::open(cfg)?;
    let tier = |s: Box<dyn ChunkStore>| -> Arc<dyn ChunkStore> {
        Arc::new(Tiered::new(s, memory_bytes, EvictionPolicy::default()))
    };
    Ok(match redis_url {
        None => tier(Box::new(sled)),
        Some(url) => {
            let mut rc = RedisConfig::at(url);
            rc.dtype = None;
            tier(Box::new(Layered::new(sled, RedisStore::open(rc)?)))
        }
    })
}

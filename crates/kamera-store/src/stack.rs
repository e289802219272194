//! The store a runtime opens: a memory tier over the sled store on disk (f32 kept exact), and
//! over a fleet's Redis when a URL is given (memory -> sled -> Redis).

use std::path::Path;
use std::sync::Arc;

use kamera_ops::Bases;

use crate::error::Result;
use crate::{ChunkStore, EvictionPolicy, Layered, RedisConfig, RedisStore, SledStore, StoreConfig, Tiered};

/// How [`open_stack_with`] opens the stack.
#[derive(Debug, Clone, Default)]
pub struct StackOptions {
    /// Bytes of decoded records the memory tier keeps.
    pub memory_bytes: u64,
    /// Write to Redis from a bounded queue of this many records (write-behind; `None`: write
    /// through). See [`Layered::write_behind`] for the durability trade-off.
    pub write_behind: Option<usize>,
    /// A PEM file of the CA (or self-signed certificate) a `rediss://` server is checked against.
    pub tls_ca: Option<std::path::PathBuf>,
    /// The patch bases the disk and Redis stores decode transform-coded records in (the
    /// model's); a record coded in another is a counted miss.
    pub bases: Bases,
}

/// Opens the runtime's store stack at `path`, with `memory_bytes` of decoded records in memory
/// (write-through to Redis, the system's TLS roots, no patch bases).
pub fn open_stack(path: &Path, redis_url: Option<&str>, memory_bytes: u64) -> Result<Arc<dyn ChunkStore>> {
    open_stack_with(
        path,
        redis_url,
        &StackOptions {
            memory_bytes,
            ..StackOptions::default()
        },
    )
}

/// Opens the runtime's store stack at `path` as `opts` says.
pub fn open_stack_with(path: &Path, redis_url: Option<&str>, opts: &StackOptions) -> Result<Arc<dyn ChunkStore>> {
    let memory_bytes = opts.memory_bytes;
    let mut cfg = StoreConfig::at(path);
    cfg.dtype = None;
    cfg.bases = opts.bases.clone();
    let sled = SledStore::open(cfg)?;
    let tier = |s: Box<dyn ChunkStore>| -> Arc<dyn ChunkStore> {
        Arc::new(Tiered::new(s, memory_bytes, EvictionPolicy::default()))
    };
    Ok(match redis_url {
        None => tier(Box::new(sled)),
        Some(url) => {
            let mut rc = RedisConfig::at(url);
            rc.dtype = None;
            rc.tls_ca = opts.tls_ca.clone();
            rc.bases = opts.bases.clone();
            let layered = Layered::new(sled, RedisStore::open(rc)?);
            match opts.write_behind {
                Some(queue) => tier(Box::new(layered.write_behind(queue))),
                None => tier(Box::new(layered)),
            }
        }
    })
}

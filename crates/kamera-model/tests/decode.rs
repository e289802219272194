//! Decode runs on its own team of threads: a rayon pool kept busy by other work (the agent's
//! background canonical KV and patches) does not hold a decode step back.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use anyhow::Result;
use kamera_model::ModelName;

#[test]
fn decode_completes_while_every_pool_thread_is_busy() -> Result<()> {
    let m = common::load(ModelName::Smollm2_135m)?;
    let mut seq = m
        .tokenizer()
        .encode_raw("Background work must not stall the token being written")?;
    let mut ctx = m.empty_context();
    m.extend(&seq, &mut ctx)?;
    // Occupy every thread of the global pool until released (or 60 s pass).
    let threads = rayon::current_num_threads();
    let (busy_tx, busy_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
    let released = Arc::new(AtomicBool::new(false));
    let blocker = {
        let (released, release_rx) = (released.clone(), release_rx.clone());
        std::thread::spawn(move || {
            rayon::broadcast(|_| {
                busy_tx.send(()).ok();
                let rx = release_rx.lock().unwrap_or_else(|p| p.into_inner());
                let _ = rx.recv_timeout(Duration::from_secs(60));
                released.store(true, Ordering::SeqCst);
            })
        })
    };
    for _ in 0..threads {
        busy_rx.recv_timeout(Duration::from_secs(30))?;
    }
    let mut steps = Vec::new();
    for t in [11u32, 42, 7] {
        steps.push(m.extend(&[t], &mut ctx)?);
        seq.push(t);
    }
    let stalled = released.load(Ordering::SeqCst);
    for _ in 0..threads {
        release_tx.send(()).ok();
    }
    blocker
        .join()
        .map_err(|_| anyhow::anyhow!("the blocking job panicked"))?;
    anyhow::ensure!(
        !stalled,
        "decode waited for the busy pool (it finished only after the pool was freed)"
    );
    let full = m.prefill(&seq, 0, &m.empty_context())?;
    let kl = common::kl(&full.logits, &steps[2].logits);
    anyhow::ensure!(kl < 1e-6, "decode next to a busy pool vs prefill: KL {kl}");
    Ok(())
}

//! `cargo bench -p kamera-sched --bench store`: (1) rehydrate throughput from sled, cold (fresh
//! open, empty sled cache) and warm (sled cache, memory tier), against reading the same encoded
//! bytes from plain files; (2) store bytes per chunk for each model: canonical KV and real
//! patches (rank 16 and 32, formed from a conditioned prefill). Prints markdown tables.

use std::time::Instant;

use anyhow::Result;
use kamera_model::{Model, ModelName, default_home, fetch};
use kamera_ops::{Bases, Buf, ChunkKv, DType, KvLayout, LayerKv, Mat, PatchConfig};
use kamera_store::{ChunkId, ChunkStore, Key, ModelFp, Record, SledStore, StoreConfig, codec};

fn synthetic(layout: KvLayout, n: usize, seed: u64) -> ChunkKv {
    let mut s = seed | 1;
    let mut vals = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    };
    let layers = (0..layout.n_layers)
        .map(|_| LayerKv {
            k: Mat::new(
                n,
                layout.k_features(),
                Buf::from_f32(DType::Bf16, &vals(n * layout.k_features())),
            )
            .unwrap(),
            v: Mat::new(
                n,
                layout.v_features(),
                Buf::from_f32(DType::Bf16, &vals(n * layout.v_features())),
            )
            .unwrap(),
        })
        .collect();
    ChunkKv::new(layout, 0, layers).unwrap()
}

fn mbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e6
}

fn throughput() -> Result<()> {
    // SmolLM2-135M's layout: 30 layers, 3 KV heads x 64.
    let layout = KvLayout::gqa(30, 9, 3, 64);
    let (n_chunks, tokens) = (12usize, 512usize);
    let model = ModelFp::of("bench");
    let dir = std::env::temp_dir().join(format!("kamera-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let keys: Vec<Key> = (0..n_chunks as u64)
        .map(|i| Key::canonical(model, ChunkId::of(&i.to_le_bytes(), "b", model)))
        .collect();
    let mut total = 0u64;
    {
        let s = SledStore::open(StoreConfig::at(dir.join("sled")))?;
        for (i, k) in keys.iter().enumerate() {
            let kv = synthetic(layout, tokens, i as u64 + 1);
            let rec = Record::kv(model, 1000, kv);
            let bytes = codec::encode(k, &rec, None)?;
            std::fs::write(dir.join(format!("plain-{i}.bin")), &bytes)?;
            total += bytes.len() as u64;
            s.put(k, rec)?;
        }
        s.flush()?;
    }
    // Dropping the OS page cache affects the whole machine: only when asked.
    let drop = || {
        std::env::var_os("KAMERA_BENCH_DROP_CACHES").is_some()
            && std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
    };
    let drop_caches = drop();
    println!(
        "\n{n_chunks} chunks x {tokens} tokens, SmolLM2 layout (30 layers, F=192), bf16: {:.1} MB encoded; OS page cache dropped before cold reads: {drop_caches}\n",
        total as f64 / 1e6
    );
    println!("| read | MB/s |\n|---|---:|");
    let time = |f: &mut dyn FnMut() -> Result<u64>| -> Result<f64> {
        let t = Instant::now();
        let b = f()?;
        Ok(mbps(b, t.elapsed().as_secs_f64()))
    };
    // Plain file, cold then warm, raw bytes and decoded.
    let files = |decode: bool| -> Result<u64> {
        let mut b = 0;
        for (i, k) in keys.iter().enumerate() {
            let bytes = std::fs::read(dir.join(format!("plain-{i}.bin")))?;
            if decode {
                std::hint::black_box(codec::decode(k, &bytes, &Bases::new())?);
            }
            b += bytes.len() as u64;
        }
        Ok(b)
    };
    let cold_file = time(&mut || files(true))?;
    let warm_file_raw = time(&mut || files(false))?;
    let warm_file = time(&mut || files(true))?;
    drop();
    // (a memory-tier hit is an Arc clone of the decoded record: no bytes move.)
    let s = SledStore::open(StoreConfig::at(dir.join("sled")))?;
    let sled_pass = |raw: bool| -> Result<u64> {
        let mut b = 0;
        for k in &keys {
            if raw {
                b += s.get_raw(k)?.map_or(0, |v| v.len() as u64);
            } else {
                let r = s.get(k)?.expect("stored");
                b += r.bytes() as u64 + 96;
            }
        }
        Ok(b)
    };
    let cold_sled = time(&mut || sled_pass(false))?;
    let warm_sled_raw = time(&mut || sled_pass(true))?;
    let warm_sled = time(&mut || sled_pass(false))?;
    for (name, v) in [
        ("plain file, cold, read + verify + decode", cold_file),
        ("plain file, warm, raw bytes", warm_file_raw),
        ("plain file, warm, read + verify + decode", warm_file),
        ("sled, cold (fresh open), get + verify + decode", cold_sled),
        ("sled, warm, raw bytes", warm_sled_raw),
        ("sled, warm, get + verify + decode", warm_sled),
    ] {
        println!("| {name} | {v:.0} |");
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

fn bytes_per_chunk() -> Result<()> {
    println!("\n| model | layout | chunk tokens | canonical KV (bf16) | patch r16 | patch r32 | r16 / KV | r32 / KV |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for name in ModelName::ALL {
        let m = Model::load(&fetch(name, &default_home())?)?;
        let fp = ModelFp::of(m.fingerprint());
        let text = "The quick brown fox jumps over the lazy dog while the caretaker locks the blue shed. ".repeat(12);
        let ante = "Alice keeps her bicycle behind the library, and Bob borrowed it on Tuesday. ".repeat(4);
        let toks = m.tokenizer().encode_raw(&text)?;
        let toks = &toks[..toks.len().min(256)];
        let a = m.tokenizer().encode_raw(&ante)?;
        let canon = m.prefill(toks, 0, &m.empty_context())?.chunk;
        let actx = m.prefill(&a, 0, &m.empty_context())?;
        let cond = m
            .prefill(toks, a.len() as i64, &kamera_model::Context::from_chunk(&actx.chunk)?)?
            .chunk;
        let id = ChunkId::of(text.as_bytes(), "t", fp);
        let kv_bytes = codec::encode(
            &Key::canonical(fp, id),
            &Record::kv(fp, 0, canon.clone()),
            Some(DType::Bf16),
        )?
        .len();
        let mut pb = Vec::new();
        for r in [16, 32] {
            let p = kamera_ops::form_patch(&cond, &canon, m.rope(), &PatchConfig::fixed(r, DType::Bf16))?;
            let key = Key::patch(fp, id, &[], 0);
            pb.push(codec::encode(&key, &Record::patch(fp, 0, p), Some(DType::Bf16))?.len());
        }
        let l = m.layout();
        println!(
            "| {} | {} layers, K/V F={}/{} | {} | {:.2} MB | {:.2} MB | {:.2} MB | {:.1}% | {:.1}% |",
            name.as_str(),
            l.n_layers,
            l.k_features(),
            l.v_features(),
            toks.len(),
            kv_bytes as f64 / 1e6,
            pb[0] as f64 / 1e6,
            pb[1] as f64 / 1e6,
            100.0 * pb[0] as f64 / kv_bytes as f64,
            100.0 * pb[1] as f64 / kv_bytes as f64,
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    throughput()?;
    if std::env::var_os("KAMERA_BENCH_NO_MODELS").is_none() {
        bytes_per_chunk()?;
    }
    Ok(())
}

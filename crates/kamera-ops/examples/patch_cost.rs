//! Where a patch's formation time goes, at SmolLM2-135M's KV geometry (30 layers, 3 KV heads of
//! 64) and 100-400-token chunks: the deficit, the per-layer SVDs, then the rank policy, the
//! truncation and the 4-bit quantisation with its refit (the runtime's `kamera-budget:0.095/q4/rf`
//! point), and `form_patch` whole. Seeded random KV with a decaying column scale; the mean of 5.
//!   cargo run --release -p kamera-ops --example patch_cost
use kamera_ops::*;
use rayon::prelude::*;
use std::time::Instant;

fn main() {
    let (layers, kvh, hd) = (30usize, 3usize, 64usize);
    let layout = KvLayout::gqa(layers, 9, kvh, hd);
    let rope = RopeSpec::new(hd, 100000.0, PairLayout::HalfSplit);
    let cfg = PatchConfig {
        rank: RankPolicy::Budget { fraction: 0.095 },
        quant: Quant::Int4,
        refit: true,
        ..PatchConfig::fixed(0, DType::Bf16)
    };
    for &n in &[100usize, 150, 250, 400] {
        let f = kvh * hd;
        let mut s = 99u64;
        let mut rnd = move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        let mut mk = |scale: f32| {
            (0..layers)
                .map(|_| {
                    let k: Vec<f32> = (0..n * f)
                        .map(|i| rnd() * scale * 0.93f32.powi((i % f) as i32))
                        .collect();
                    let v: Vec<f32> = (0..n * f)
                        .map(|i| rnd() * scale * 0.93f32.powi((i % f) as i32))
                        .collect();
                    LayerKv {
                        k: Mat::from_f32(n, f, k).unwrap(),
                        v: Mat::from_f32(n, f, v).unwrap(),
                    }
                })
                .collect::<Vec<_>>()
        };
        let canon = ChunkKv::new(layout, 0, mk(1.0)).unwrap();
        let cond = ChunkKv::new(layout, 0, mk(1.0)).unwrap();
        let reps = 5;
        let (mut td, mut ts, mut tp, mut tall) = (0.0, 0.0, 0.0, 0.0);
        for _ in 0..reps {
            let t = Instant::now();
            let d = deficit(&cond, &canon, &rope).unwrap();
            td += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let svds: Vec<(Svd, Svd)> = d
                .layers
                .par_iter()
                .map(|(k, v)| (Svd::compute(k).unwrap(), Svd::compute(v).unwrap()))
                .collect();
            ts += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let _p = patch_from_svds(&svds, n, &layout, canon.kv_bytes(), &cfg).unwrap();
            tp += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let _q = form_patch(&cond, &canon, &rope, &cfg).unwrap();
            tall += t.elapsed().as_secs_f64();
        }
        let ms = |x: f64| x * 1e3 / reps as f64;
        println!(
            "n {n}: deficit {:.1} ms, svds {:.1} ms, ranks+truncate+quant {:.1} ms; form_patch {:.1} ms",
            ms(td),
            ms(ts),
            ms(tp),
            ms(tall)
        );
    }
}

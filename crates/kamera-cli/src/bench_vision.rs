//! `kamera bench vision`: one screenshot through a vision-language model on the product's own
//! path (HF-exact preprocessing, `Vision::encode`, the image chunk prefilled with its 3-D
//! rotary ids as the Session prefills it), and with `--against transformers` HF transformers
//! (torch on CPU, scripts/bench_vision_torch.py) on the same checkpoint, image, pixel budget and
//! threads, alternating in one run. Prints medians with their quartiles, the paired ratios, the
//! KL between the two engines' last-position logits, both peak memories and the machine.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use clap::Args;
use kamera_model::vision::RgbImage;
use kamera_model::{Input, Model, PrefillOptions};
use serde::Serialize;

use crate::bench_session_report::Machine;
use crate::bench_stats::{Spread, paired};

#[derive(Args)]
pub struct VisionArgs {
    /// A vision-language model directory (Qwen2.5-VL), or a name added with `kamera models add`.
    #[arg(long)]
    model: String,
    /// The synthetic screenshot's size, WIDTHxHEIGHT.
    #[arg(long, default_value = "1280x720")]
    image_size: String,
    /// The pixel budget both engines resize within (28x28 pixels per image token; the Session's
    /// default is 200704, HF's processor default 12845056).
    #[arg(long, default_value_t = 200_704)]
    pixels: usize,
    /// Rounds (at least 3); with --against each is a pair, alternating which engine goes first.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// `transformers`: HF transformers + torch on CPU (scripts/vl-venv.sh installs them once).
    #[arg(long)]
    against: Option<String>,
    /// torch's dtype with --against: `bf16` (its fastest on CPUs with AMX or AVX512_BF16) or `f32`.
    #[arg(long, default_value = "bf16")]
    torch_dtype: String,
    /// Our prefill precision (`f32` or `bf16`); default the fastest this CPU runs.
    #[arg(long)]
    prefill_precision: Option<kamera_model::PrefillPrecision>,
    /// With --against: neither engine holds its model while the other runs; each round loads
    /// its engine first (untimed) and lets it go after, for a machine that cannot hold both
    /// (HF's f32 beside ours). Our peak RSS is then the bench process's, theirs each peer's.
    #[arg(long)]
    one_at_a_time: bool,
    /// Where to write the JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One round of one engine, ms.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize)]
struct Round {
    preprocess_ms: f64,
    tower_ms: f64,
    /// Tower + prefill of the image chunk.
    encode_ms: f64,
}

#[derive(Debug, Serialize)]
struct EngineSummary {
    name: String,
    preprocess_ms: Spread,
    tower_ms: Spread,
    encode_ms: Spread,
    peak_rss_mb: f64,
    detail: serde_json::Value,
}

#[derive(Debug, Serialize)]
struct Report {
    model: String,
    random_weights: bool,
    image: [usize; 2],
    pixels: usize,
    grid: [usize; 3],
    image_tokens: usize,
    rounds: usize,
    threads: usize,
    engines: Vec<EngineSummary>,
    /// Ours / theirs per round (time ratios: above 1 means we are faster), median and quartiles.
    speedup_tower: Option<Spread>,
    speedup_encode: Option<Spread>,
    /// KL(theirs ‖ ours) of the last position's next-token distribution, and whether the argmax
    /// agrees.
    kl: Option<f64>,
    same_argmax: Option<bool>,
    machine: Machine,
}

pub fn run(a: VisionArgs) -> Result<()> {
    if a.rounds < 3 {
        bail!("--rounds {}: at least 3 (medians and quartiles)", a.rounds);
    }
    let size = crate::bench_reuse::parse_size("--image-size", &a.image_size)?;
    let machine = Machine::now();
    let path = crate::models::resolve(&a.model)?;
    if a.one_at_a_time && a.against.is_none() {
        bail!("--one-at-a-time alternates two engines' loads: it needs --against");
    }
    let load = || -> Result<Model> {
        let model = crate::models::load_with(&a.model, a.prefill_precision)?;
        if model.vision().is_none() {
            bail!(
                "{}: bench vision needs a vision-language model directory",
                path.display()
            );
        }
        Ok(model)
    };
    let mut held = Some(load()?);
    let model = held.as_ref().expect("just loaded");
    let vision = model.vision().expect("checked on load");
    let image = crate::bench_image::screenshot(size[0], size[1])?;
    let cfg = vision.preprocess_config().clone().with_max_pixels(a.pixels);
    let grid = kamera_model::vision::preprocess(&image, &cfg)?.grid_thw;
    let image_tokens = vision.image_tokens(grid);
    let our_detail = serde_json::json!({
        "prefill_precision": model.prefill_precision().to_string(),
        "weights_mb": model.weight_bytes().total as f64 / (1 << 20) as f64,
    });
    let ours = |model: &Model, last: &mut Vec<f32>| -> Result<Round> {
        let vision = model.vision().expect("checked on load");
        let t0 = Instant::now();
        let p = kamera_model::vision::preprocess(&image, &cfg)?;
        let t1 = Instant::now();
        let out = vision.encode(&p.pixel_values, p.grid_thw)?;
        let t2 = Instant::now();
        *last = prefill_chunk(model, &out.embeds, p.grid_thw)?;
        let t3 = Instant::now();
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        Ok(Round {
            preprocess_ms: ms(t0, t1),
            tower_ms: ms(t1, t2),
            encode_ms: ms(t1, t3),
        })
    };
    let mut our_logits = Vec::new();
    let mut our_rounds = Vec::new();
    let mut their_rounds = Vec::new();
    let mut theirs = None;
    match a.against.as_deref() {
        None => {
            for _ in 0..a.rounds {
                our_rounds.push(ours(model, &mut our_logits)?);
            }
        }
        Some("transformers") => {
            let png = std::env::temp_dir().join(format!("kamera-bench-vision-{}.ppm", std::process::id()));
            write_ppm(&image, &png)?;
            let start = || -> Result<Torch> {
                let peer = Torch::start(&path, &png, a.pixels, &a.torch_dtype)?;
                let their_grid: Vec<usize> = serde_json::from_value(peer.ready["grid"].clone())?;
                if their_grid != grid {
                    bail!(
                        "transformers resized the screenshot to grid {their_grid:?}, we to {grid:?}: not the same input"
                    );
                }
                Ok(peer)
            };
            eprintln!(
                "bench vision: {} rounds of (kamera, transformers), alternating{}...",
                a.rounds,
                if a.one_at_a_time {
                    ", each engine loaded for its round alone"
                } else {
                    ""
                }
            );
            if a.one_at_a_time {
                drop(held.take());
                let (mut ready, mut logits, mut peak) = (serde_json::Value::Null, Vec::new(), 0f64);
                paired(
                    a.rounds,
                    || {
                        let model = load()?;
                        let r = ours(&model, &mut our_logits)?;
                        our_rounds.push(r);
                        Ok(r.encode_ms)
                    },
                    || {
                        let mut peer = start()?;
                        let r = peer.round()?;
                        their_rounds.push(r);
                        logits = peer.logits()?;
                        peak = peak.max(peer.peak_rss_mb());
                        ready = peer.ready.clone();
                        Ok(r.encode_ms)
                    },
                )?;
                theirs = Some((ready, logits, peak));
            } else {
                let mut peer = start()?;
                paired(
                    a.rounds,
                    || {
                        let r = ours(model, &mut our_logits)?;
                        our_rounds.push(r);
                        Ok(r.encode_ms)
                    },
                    || {
                        let r = peer.round()?;
                        their_rounds.push(r);
                        Ok(r.encode_ms)
                    },
                )?;
                let logits = peer.logits()?;
                let peak = peer.peak_rss_mb();
                theirs = Some((peer.ready.clone(), logits, peak));
            }
            let _ = std::fs::remove_file(&png);
        }
        Some(other) => bail!("--against {other:?}: expected transformers"),
    }
    let spread = |rs: &[Round], f: fn(&Round) -> f64| Spread::of(&rs.iter().map(f).collect::<Vec<_>>());
    let summary = |name: &str, rs: &[Round], peak: f64, detail: serde_json::Value| EngineSummary {
        name: name.into(),
        preprocess_ms: spread(rs, |r| r.preprocess_ms),
        tower_ms: spread(rs, |r| r.tower_ms),
        encode_ms: spread(rs, |r| r.encode_ms),
        peak_rss_mb: peak,
        detail,
    };
    let mut engines = vec![summary(
        "kamera",
        &our_rounds,
        crate::bench::proc_status_mb("VmHWM"),
        our_detail,
    )];
    let ratio = |f: fn(&Round) -> f64| {
        Spread::of(
            &our_rounds
                .iter()
                .zip(&their_rounds)
                .map(|(o, t)| f(t) / f(o))
                .collect::<Vec<_>>(),
        )
    };
    let (mut kl, mut same, mut speedup_tower, mut speedup_encode) = (None, None, None, None);
    if let Some((ready, logits, peak)) = theirs {
        engines.push(summary("transformers", &their_rounds, peak, ready));
        kl = Some(kamera_eval::kl(&logits, &our_logits));
        same = Some(kamera_model::argmax(&logits) == kamera_model::argmax(&our_logits));
        speedup_tower = Some(ratio(|r| r.tower_ms));
        speedup_encode = Some(ratio(|r| r.encode_ms));
    }
    let report = Report {
        model: path.display().to_string(),
        random_weights: path.join("README.md").is_file()
            && std::fs::read_to_string(path.join("README.md"))?.contains("Random weights"),
        image: size,
        pixels: a.pixels,
        grid,
        image_tokens,
        rounds: a.rounds,
        threads: rayon::current_num_threads(),
        engines,
        speedup_tower,
        speedup_encode,
        kl,
        same_argmax: same,
        machine: machine.finish(),
    };
    println!("{}", markdown(&report));
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// The image chunk (`<|vision_start|>`, the image tokens, `<|vision_end|>`) prefilled at 0 with
/// its 3-D rotary ids, as the Session prefills a screenshot; the last position's logits.
fn prefill_chunk(model: &Model, embeds: &[f32], grid: [usize; 3]) -> Result<Vec<f32>> {
    let vision = model.vision().context("a vision-language model")?;
    let ids = vision.chunk_tokens(grid);
    let x = vision.splice(&ids, model.embed_tokens(&ids)?, &[embeds])?;
    let out = model.prefill_rotary(
        Input::Embeddings { data: &x, n: ids.len() },
        &vision.chunk_positions(grid, 0),
        &model.empty_context(),
        PrefillOptions::default(),
    )?;
    Ok(out.logits)
}

/// A binary PPM (P6): what PIL opens without a codec, pixel for pixel.
fn write_ppm(img: &RgbImage, path: &Path) -> Result<()> {
    let mut f =
        std::io::BufWriter::new(std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?);
    write!(f, "P6\n{} {}\n255\n", img.width(), img.height())?;
    f.write_all(img.data())?;
    f.flush()?;
    Ok(())
}

/// scripts/bench_vision_torch.py, serving rounds over a pipe.
struct Torch {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    ready: serde_json::Value,
}

impl Torch {
    fn start(model: &Path, image: &Path, pixels: usize, dtype: &str) -> Result<Torch> {
        let scripts = crate::bench_llamacpp::scripts_dir();
        let python = crate::bench_llamacpp::venv_python(&scripts, "vl-venv.sh")?;
        let mut child = Command::new(&python)
            .arg(scripts.join("bench_vision_torch.py"))
            .args([
                "--model",
                &model.display().to_string(),
                "--image",
                &image.display().to_string(),
            ])
            .args(["--max-pixels", &pixels.to_string(), "--dtype", dtype])
            .args(["--threads", &rayon::current_num_threads().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", python.display()))?;
        let stdin = child.stdin.take().context("the peer's stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("the peer's stdout")?);
        let mut t = Torch {
            child,
            stdin,
            stdout,
            ready: serde_json::Value::Null,
        };
        t.ready = t.answer()?;
        Ok(t)
    }

    fn answer(&mut self) -> Result<serde_json::Value> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("scripts/bench_vision_torch.py ended without an answer (its error is above)");
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("the peer's answer {line:?}"))?;
        if let Some(e) = v.get("error") {
            bail!("scripts/bench_vision_torch.py: {e}");
        }
        Ok(v)
    }

    fn round(&mut self) -> Result<Round> {
        writeln!(self.stdin, "run")?;
        self.stdin.flush()?;
        Ok(serde_json::from_value(self.answer()?)?)
    }

    /// The last round's last-position logits.
    fn logits(&mut self) -> Result<Vec<f32>> {
        let p = std::env::temp_dir().join(format!("kamera-bench-vision-{}.f32", std::process::id()));
        writeln!(self.stdin, "logits {}", p.display())?;
        self.stdin.flush()?;
        self.answer()?;
        let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
        let _ = std::fs::remove_file(&p);
        Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    fn peak_rss_mb(&self) -> f64 {
        crate::bench::proc_kb(&format!("/proc/{}/status", self.child.id()), "VmHWM").map_or(f64::NAN, |kb| kb / 1024.0)
    }
}

impl Drop for Torch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn markdown(r: &Report) -> String {
    let mut s = format!(
        "## {}: a {}x{} screenshot, grid {:?}: {} image tokens ({} rounds, {} threads)\n\n",
        r.model, r.image[0], r.image[1], r.grid, r.image_tokens, r.rounds, r.threads
    );
    if r.random_weights {
        s += "Random weights: cost, not behaviour.\n\n";
    }
    s += "| engine | preprocess ms | tower ms | tower + prefill ms | peak RSS MB |\n|---|---:|---:|---:|---:|\n";
    for e in &r.engines {
        s += &format!(
            "| {} ({}) | {} | {} | {} | {:.0} |\n",
            e.name,
            e.detail
                .get("prefill_precision")
                .or_else(|| e.detail.get("dtype"))
                .and_then(|v| v.as_str())
                .unwrap_or("?"),
            e.preprocess_ms.md(1),
            e.tower_ms.md(1),
            e.encode_ms.md(1),
            e.peak_rss_mb
        );
    }
    if let (Some(t), Some(e)) = (r.speedup_tower, r.speedup_encode) {
        s += &format!(
            "\nPaired speedup (theirs / ours per round, median [q1-q3]): tower {}x, tower + prefill {}x.\n",
            t.md(2),
            e.md(2)
        );
    }
    if let (Some(kl), Some(same)) = (r.kl, r.same_argmax) {
        s += &format!("Last position: KL(transformers ‖ kamera) {kl:.2e}, same argmax: {same}.\n");
    }
    let m = &r.machine;
    s += &format!(
        "\nMachine: {}, {} cores, {}, load {} -> {}, commit {}.\n",
        m.cpu, m.cores, m.date, m.loadavg_start, m.loadavg_end, m.commit
    );
    s
}

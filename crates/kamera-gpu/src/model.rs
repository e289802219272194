//! What the device transformer ([`crate::DeviceModel`]) runs: the shape and flags of a
//! llama / qwen2 / gemma3 decoder and its weights on the host, as kamera-model hands them over
//! (or seeded random ones, for parity tests and benches where no checkpoint can travel).

use kamera_ops::{KvLayout, PairLayout, RopeSpec};

/// Shape and family flags of a decoder (the fields of kamera-model's `Config` the forward needs).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    pub layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub rms_eps: f32,
    pub rope: RopeSpec,
    /// Sliding window of each layer (`None`: full causal attention).
    pub windows: Vec<Option<usize>>,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    /// Norms after attention and after the MLP (Gemma's sandwich).
    pub post_norms: bool,
    /// Token embeddings are multiplied by this (1 for most families).
    pub embed_scale: f32,
    /// GELU (tanh) instead of SiLU in the MLP gate.
    pub gelu: bool,
    pub attn_scale: f32,
}

impl ModelSpec {
    /// Qwen2.5-0.5B's shape (kamera-model's tests check it against the GGUF's configuration).
    pub fn qwen25_05b() -> ModelSpec {
        ModelSpec::plain(
            24,
            896,
            4864,
            14,
            2,
            64,
            151_936,
            1e-6,
            1_000_000.0,
            PairLayout::HalfSplit,
            true,
        )
    }

    /// SmolLM2-135M's shape (llama; interleaved pairs after llama.cpp's Q/K permutation).
    pub fn smollm2_135m() -> ModelSpec {
        ModelSpec::plain(
            30,
            576,
            1536,
            9,
            3,
            64,
            49_152,
            1e-5,
            100_000.0,
            PairLayout::Interleaved,
            false,
        )
    }

    /// A named shape: `qwen2.5-0.5b` or `smollm2-135m`.
    pub fn named(name: &str) -> Option<ModelSpec> {
        match name {
            "qwen2.5-0.5b" => Some(ModelSpec::qwen25_05b()),
            "smollm2-135m" => Some(ModelSpec::smollm2_135m()),
            _ => None,
        }
    }

    /// A llama/qwen2-style decoder: SiLU, no QK-norm, full attention, one RoPE base.
    #[allow(clippy::too_many_arguments)]
    pub fn plain(
        layers: usize,
        hidden: usize,
        ffn: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        vocab: usize,
        rms_eps: f32,
        base: f64,
        pairs: PairLayout,
        qkv_bias: bool,
    ) -> ModelSpec {
        ModelSpec {
            layers,
            hidden,
            ffn,
            heads,
            kv_heads,
            head_dim,
            vocab,
            rms_eps,
            rope: RopeSpec::new(head_dim, base, pairs).with_layer_bases(vec![base; layers]),
            windows: vec![None; layers],
            qkv_bias,
            qk_norm: false,
            post_norms: false,
            embed_scale: 1.0,
            gelu: false,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
        }
    }

    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
    /// KV layout of the chunks this model produces.
    pub fn kv_layout(&self) -> KvLayout {
        KvLayout::gqa(self.layers, self.heads, self.kv_heads, self.head_dim)
    }

    /// What the device kernels cannot run, if anything.
    pub fn unsupported(&self) -> Option<String> {
        let s = self;
        if s.layers == 0 || s.hidden == 0 || s.ffn == 0 || s.vocab == 0 {
            return Some("zero layers, hidden, ffn or vocab".into());
        }
        if s.kv_heads == 0 || s.heads % s.kv_heads != 0 {
            return Some(format!(
                "{} heads are not a multiple of {} kv heads",
                s.heads, s.kv_heads
            ));
        }
        if s.head_dim % 32 != 0 || s.head_dim > 256 {
            return Some(format!(
                "head_dim {} (the attention kernel takes multiples of 32 up to 256)",
                s.head_dim
            ));
        }
        if s.windows.len() != s.layers {
            return Some(format!("{} windows for {} layers", s.windows.len(), s.layers));
        }
        if s.rope.mrope_sections.is_some() {
            return Some("M-RoPE positions (the device forward takes scalar positions)".into());
        }
        if s.rope.head_dim != s.head_dim {
            return Some(format!("RoPE head_dim {} != head_dim {}", s.rope.head_dim, s.head_dim));
        }
        s.rope.validate().err().map(|e| e.to_string())
    }
}

/// One layer's weights on the host, f32, linear weights `[out, in]` row-major.
#[derive(Debug, Clone)]
pub struct HostLayer {
    pub attn_norm: Vec<f32>,
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    /// Q, K and V biases (`qkv_bias`).
    pub bias: Option<[Vec<f32>; 3]>,
    /// Q and K norm weights over one head (`qk_norm`).
    pub qk_norm: Option<[Vec<f32>; 2]>,
    pub wo: Vec<f32>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Vec<f32>,
    pub w_up: Vec<f32>,
    pub w_down: Vec<f32>,
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// All weights on the host.
#[derive(Debug, Clone)]
pub struct HostWeights {
    /// `[vocab, hidden]`.
    pub embed: Vec<f32>,
    pub layers: Vec<HostLayer>,
    pub out_norm: Vec<f32>,
    /// `[vocab, hidden]`; `None` when tied to `embed`.
    pub lm_head: Option<Vec<f32>>,
}

/// A small seeded generator (splitmix64) for reproducible random weights without a dependency.
struct Seeded(u64);

impl Seeded {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    /// `n` values uniform in ±`scale`.
    fn fill(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
    /// Norm weights near 1.
    fn norm(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| 1.0 + 0.1 * self.next()).collect()
    }
}

impl HostWeights {
    /// Seeded random weights of `spec`'s shape, scaled so activations stay O(1) through the layers
    /// (uniform ±√(3/fan_in) linear weights, norms near 1).
    pub fn random(spec: &ModelSpec, seed: u64) -> HostWeights {
        let mut r = Seeded(seed);
        let (h, f, qd, kvd, hd) = (spec.hidden, spec.ffn, spec.q_dim(), spec.kv_dim(), spec.head_dim);
        let lin = |r: &mut Seeded, out: usize, inp: usize| r.fill(out * inp, (3.0 / inp as f32).sqrt());
        let layers = (0..spec.layers)
            .map(|_| HostLayer {
                attn_norm: r.norm(h),
                wq: lin(&mut r, qd, h),
                wk: lin(&mut r, kvd, h),
                wv: lin(&mut r, kvd, h),
                bias: spec
                    .qkv_bias
                    .then(|| [r.fill(qd, 0.5), r.fill(kvd, 0.5), r.fill(kvd, 0.5)]),
                qk_norm: spec.qk_norm.then(|| [r.norm(hd), r.norm(hd)]),
                wo: lin(&mut r, h, qd),
                post_attn_norm: spec.post_norms.then(|| r.norm(h)),
                ffn_norm: r.norm(h),
                w_gate: lin(&mut r, f, h),
                w_up: lin(&mut r, f, h),
                w_down: lin(&mut r, h, f),
                post_ffn_norm: spec.post_norms.then(|| r.norm(h)),
            })
            .collect();
        HostWeights {
            embed: r.fill(spec.vocab * h, 1.0),
            layers,
            out_norm: r.norm(h),
            lm_head: None,
        }
    }

    /// Checks every tensor has the length `spec` implies, naming the first that does not.
    pub fn check(&self, spec: &ModelSpec) -> Result<(), String> {
        let (h, f, qd, kvd, hd) = (spec.hidden, spec.ffn, spec.q_dim(), spec.kv_dim(), spec.head_dim);
        let want = |name: String, v: &[f32], n: usize| {
            if v.len() == n {
                Ok(())
            } else {
                Err(format!("{name}: expected {n} values, got {}", v.len()))
            }
        };
        want("embed".into(), &self.embed, spec.vocab * h)?;
        want("out_norm".into(), &self.out_norm, h)?;
        if let Some(lm) = &self.lm_head {
            want("lm_head".into(), lm, spec.vocab * h)?;
        }
        if self.layers.len() != spec.layers {
            return Err(format!(
                "{} layers given, the spec has {}",
                self.layers.len(),
                spec.layers
            ));
        }
        for (l, w) in self.layers.iter().enumerate() {
            let n = |s: &str| format!("layer {l} {s}");
            want(n("attn_norm"), &w.attn_norm, h)?;
            want(n("wq"), &w.wq, qd * h)?;
            want(n("wk"), &w.wk, kvd * h)?;
            want(n("wv"), &w.wv, kvd * h)?;
            want(n("wo"), &w.wo, h * qd)?;
            want(n("ffn_norm"), &w.ffn_norm, h)?;
            want(n("w_gate"), &w.w_gate, f * h)?;
            want(n("w_up"), &w.w_up, f * h)?;
            want(n("w_down"), &w.w_down, h * f)?;
            match (&w.bias, spec.qkv_bias) {
                (Some([q, k, v]), true) => {
                    want(n("q bias"), q, qd)?;
                    want(n("k bias"), k, kvd)?;
                    want(n("v bias"), v, kvd)?;
                }
                (None, false) => {}
                _ => return Err(n("QKV bias present where the spec says otherwise (or missing)")),
            }
            match (&w.qk_norm, spec.qk_norm) {
                (Some([q, k]), true) => {
                    want(n("q norm"), q, hd)?;
                    want(n("k norm"), k, hd)?;
                }
                (None, false) => {}
                _ => return Err(n("QK-norm weights present where the spec says otherwise (or missing)")),
            }
            for (name, x) in [
                ("post_attn_norm", &w.post_attn_norm),
                ("post_ffn_norm", &w.post_ffn_norm),
            ] {
                match (x, spec.post_norms) {
                    (Some(v), true) => want(n(name), v, h)?,
                    (None, false) => {}
                    _ => return Err(n(&format!("{name} present where the spec says otherwise (or missing)"))),
                }
            }
        }
        Ok(())
    }
}

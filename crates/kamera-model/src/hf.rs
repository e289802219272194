//! A Hugging Face model directory: config.json, safetensors (one file or shards with their index),
//! tokenizer.json. Tensors are read by name, their shape checked: in f32 (stored f32, bf16 or f16),
//! or, for a linear weight stored in bf16, straight into the bf16 matrix that holds it
//! ([`SafeDir::linear`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use safetensors::{Dtype, tensor::TensorView};
use sha2::{Digest, Sha256};

use crate::PrefillPrecision;
use crate::error::{CandleCtx, Error, Result};
use crate::quant::Linear;

/// The safetensors weights of a model directory, memory-mapped (public for kamera-fuzz, which
/// fuzzes this loader).
pub struct SafeDir {
    dir: PathBuf,
    files: Vec<PathBuf>,
    st: MmapedSafetensors,
}

impl std::fmt::Debug for SafeDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafeDir").field("files", &self.files).finish()
    }
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Reads and parses a JSON file of the directory, naming it in errors.
pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(io("read json", path))?;
    serde_json::from_str(&text).map_err(|e| Error::Invalid {
        op: "read json",
        detail: format!("{}: {e}", path.display()),
    })
}

impl SafeDir {
    /// Opens `model.safetensors.index.json` and its shards, or else `model.safetensors`.
    pub fn open(dir: &Path) -> Result<SafeDir> {
        const OP: &str = "SafeDir::open";
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let files: Vec<PathBuf> = if index.is_file() {
            let v = read_json(&index)?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| Error::Invalid {
                    op: OP,
                    detail: format!("{}: no \"weight_map\" object", index.display()),
                })?;
            let names: BTreeSet<&str> = map.values().filter_map(|f| f.as_str()).collect();
            names.into_iter().map(|f| dir.join(f)).collect()
        } else if single.is_file() {
            vec![single]
        } else {
            return Err(Error::Invalid {
                op: OP,
                detail: format!(
                    "{}: neither model.safetensors.index.json nor model.safetensors is there",
                    dir.display()
                ),
            });
        };
        if let Some(missing) = files.iter().find(|f| !f.is_file()) {
            return Err(Error::Invalid {
                op: OP,
                detail: format!("shard {} named by the index is missing", missing.display()),
            });
        }
        // SAFETY: the files are mapped read-only; like every mmap reader we rely on them not being
        // truncated while the model is loaded (weights are copied to owned tensors at load).
        let st = unsafe { MmapedSafetensors::multi(&files) }.ctx(OP)?;
        Ok(SafeDir {
            dir: dir.to_path_buf(),
            files,
            st,
        })
    }

    /// Every tensor's name and shape, in name order.
    pub fn tensors(&self) -> Vec<(String, Vec<usize>)> {
        let mut v: Vec<_> = self
            .st
            .tensors()
            .into_iter()
            .map(|(n, t)| (n, t.shape().to_vec()))
            .collect();
        v.sort();
        v
    }

    pub fn has(&self, name: &str) -> bool {
        self.st.get(name).is_ok()
    }

    /// Tensor `name`'s view, which must have `shape`.
    fn view(&self, name: &str, shape: &[usize]) -> Result<TensorView<'_>> {
        let view = self.st.get(name).map_err(|_| Error::MissingTensor {
            path: self.dir.clone(),
            name: name.to_string(),
        })?;
        if view.shape() != shape {
            return Err(Error::Shape {
                op: "load safetensors",
                detail: format!("tensor {name}: expected shape {shape:?}, found {:?}", view.shape()),
            });
        }
        Ok(view)
    }

    /// Tensor `name` in f32, which must have `shape`.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let view = self.view(name, shape)?;
        let t = self
            .st
            .load(name, &Device::Cpu)
            .and_then(|t| t.to_dtype(DType::F32))
            .ctx("load safetensors")?;
        release(view.data());
        Ok(t)
    }

    /// Tensor `name`, which must have `shape`, as a linear weight `[shape[0], the rest's product]`
    /// (a convolution's kernel flattened per output channel) held for `precision`: a bf16 tensor
    /// goes from the file straight into bf16 pairs (no f32 copy, the same matrix
    /// [`Linear::dense`] makes of it widened), any other through f32.
    pub(crate) fn linear(&self, name: &str, shape: &[usize], precision: PrefillPrecision) -> Result<Linear> {
        let Some((&rows, rest)) = shape.split_first() else {
            return Err(Error::Shape {
                op: "load safetensors",
                detail: format!("tensor {name}: a linear weight needs at least one dimension"),
            });
        };
        let cols = rest.iter().product();
        let view = self.view(name, shape)?;
        if view.dtype() == Dtype::BF16
            && let Some(l) = Linear::bf16_bytes(view.data(), rows, cols, precision)
        {
            release(view.data());
            return Ok(l);
        }
        let w = self.f32(name, shape)?.reshape((rows, cols)).ctx("load safetensors")?;
        Linear::dense(w, precision)
    }

    /// sha256 over every shard (in name order), hex.
    pub fn sha256(&self) -> Result<String> {
        let mut h = Sha256::new();
        for f in &self.files {
            let mut file = std::fs::File::open(f).map_err(io("hash safetensors", f))?;
            std::io::copy(&mut file, &mut h).map_err(io("hash safetensors", f))?;
        }
        Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// Hands a copied tensor's mapped pages back to the kernel (they are read again from the file if
/// touched): the pages of a checkpoint being loaded would otherwise count in the process's
/// resident memory beside the weights made from them (a 3B bf16 checkpoint: 7.5 GB more).
fn release(bytes: &[u8]) {
    #[cfg(unix)]
    {
        // SAFETY: the range lies in a read-only file mapping that stays mapped (widened to whole
        // pages, which are file-backed too); MADV_DONTNEED on such a mapping only drops pages,
        // later reads fault them in from the file unchanged. Failure is harmless (pages stay).
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE).max(4096) as usize;
            let start = bytes.as_ptr() as usize / page * page;
            let end = (bytes.as_ptr() as usize + bytes.len()).next_multiple_of(page);
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
}

/// Numeric field `key` of a JSON object, as usize, or an error naming the file and the key.
pub(crate) fn usize_field(v: &serde_json::Value, key: &str, file: &Path) -> Result<usize> {
    v.get(key)
        .and_then(|x| x.as_u64())
        .map(|x| x as usize)
        .ok_or_else(|| Error::Invalid {
            op: "read config",
            detail: format!("{}: missing or non-integer \"{key}\"", file.display()),
        })
}

/// Float field `key` of the first of `objs` that has it: an error naming it when none does (a
/// value that changes the math never gets a default).
pub(crate) fn f64_field(objs: &[&serde_json::Value], key: &str, file: &Path) -> Result<f64> {
    objs.iter()
        .find_map(|v| v.get(key))
        .map(|x| {
            x.as_f64().ok_or_else(|| Error::Invalid {
                op: "read config",
                detail: format!("{}: \"{key}\" = {x} is not a number", file.display()),
            })
        })
        .unwrap_or_else(|| {
            Err(Error::Invalid {
                op: "read config",
                detail: format!(
                    "{}: missing \"{key}\" (it changes the math; no default is assumed)",
                    file.display()
                ),
            })
        })
}

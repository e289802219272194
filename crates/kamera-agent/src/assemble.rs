//! The runtime, assembled once from one [`RuntimeConfig`]: the model, this machine's calibration,
//! the model's measured patch points (by fingerprint), its patch basis, the chunk store stack and
//! the backend. [`open_runtime`] is the only place a [`Session`] is put together for a run:
//! [`crate::AgentBuilder::build`], `kamera run`/`record` and the harness all call it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kamera_gpu::{Backend, CpuBackend};
use kamera_model::{Model, ModelName, PrefillPrecision};
use kamera_ops::{Bases, DType, PatchBasis, PatchConfig};
use kamera_sched::CostModel;
use kamera_store::{ChunkStore, MemStore, ModelFp, StackOptions};

use crate::calibration::Calibration;
use crate::error::{Error, Result, model};
use crate::runtime::{Session, SessionConfig};
use crate::scenario::Budget;

/// Which model the runtime runs.
#[derive(Clone, Default)]
pub enum ModelSource {
    /// The embedded default, SmolLM2-135M-Instruct (fetched once into `$KAMERA_HOME`).
    #[default]
    Default,
    /// A model kamera-model fetches by name.
    Known(ModelName),
    /// A `.gguf` file or a model directory (Qwen2.5-VL).
    Path(PathBuf),
    /// A model already loaded (shared: it keeps its own prefill precision).
    Loaded(Arc<Model>),
}

/// Where the cost model's machine rates come from.
#[derive(Clone, Debug, Default)]
pub enum CalibrationSource {
    /// `kamera calibrate`'s file for this model under `$KAMERA_HOME/calibration/`, when there is
    /// one (else the defaults, with a warning).
    #[default]
    Installed,
    /// This calibration file (an error when it does not read or was measured on another model).
    Path(PathBuf),
    /// The stated defaults ([`CostModel::default`]: SmolLM2-135M on a 2-core CPU), silently.
    Defaults,
}

/// Where the model's patch basis (for transform-coded patches) comes from.
#[derive(Clone, Default)]
pub enum BasisSource {
    /// `$KAMERA_HOME/bases/<fingerprint>.bin` (the first 16 hex digits of
    /// `ModelFp::of(model.base_fingerprint())`) when it exists.
    #[default]
    Installed,
    /// A basis file written by `kamera eval --calibrate-basis`.
    Path(PathBuf),
    /// A basis already loaded.
    Loaded(Arc<PatchBasis>),
    /// No basis: transform-coded points are never chosen.
    None,
}

/// The chunk store the runtime keeps canonical KV and patches in.
#[derive(Clone, Default)]
pub enum StoreSource {
    /// In memory, this runtime only.
    #[default]
    Memory,
    /// The tiered stack: a memory tier over the sled store in `dir` (default
    /// `$KAMERA_HOME/store`), over a Redis server shared by a fleet when `redis` is a
    /// `redis://` or `rediss://` URL. A sled store held by another process falls back to memory
    /// with a warning.
    Stack {
        dir: Option<PathBuf>,
        redis: Option<String>,
        /// With Redis: write from a bounded queue of this many records (write-behind).
        write_behind: Option<usize>,
        /// With `rediss://`: the CA (PEM) to check the server against.
        tls_ca: Option<PathBuf>,
    },
    /// A store the caller opened.
    Given(Arc<dyn ChunkStore>),
}

/// Bytes of decoded records the stack's memory tier keeps in front of the disk store.
pub const MEMORY_TIER_BYTES: u64 = 1 << 30;

/// Everything a runtime is assembled from.
pub struct RuntimeConfig {
    pub model: ModelSource,
    /// Prefill precision of a model loaded here (default: the fastest this CPU runs).
    pub precision: Option<PrefillPrecision>,
    pub calibration: CalibrationSource,
    pub basis: BasisSource,
    pub store: StoreSource,
    /// The window and patch settings (a scenario's `[budget]`).
    pub budget: Budget,
    /// Reuse KV between steps (the product). `false`: every model call re-prefills the window
    /// from scratch and nothing is stored, the baseline `kamera run --no-reuse` times.
    pub reuse: bool,
    /// Relocation and patching (default: the CPU reference backend).
    pub backend: Option<Box<dyn Backend + Send>>,
    /// `$KAMERA_HOME` (models, calibration, bases).
    pub home: PathBuf,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            model: ModelSource::Default,
            precision: None,
            calibration: CalibrationSource::Installed,
            basis: BasisSource::Installed,
            store: StoreSource::Memory,
            budget: Budget::default(),
            reuse: true,
            backend: None,
            home: kamera_model::default_home(),
        }
    }
}

impl RuntimeConfig {
    /// This configuration with its model loaded and its store opened once, so that every runtime
    /// opened from its [`RuntimeConfig::duplicate`]s (parallel episodes, a worker's episodes)
    /// shares the weights and the chunk store: one sled database per process, one Redis pool.
    pub fn shared(mut self) -> Result<RuntimeConfig> {
        let (model, _, store) = open_parts(&self)?;
        self.store = StoreSource::Given(store);
        self.model = ModelSource::Loaded(model);
        Ok(self)
    }

    /// Another configuration from the same sources (a loaded model or a given store stays shared).
    /// A backend is a runtime's own and is not copied: the copy gets the CPU reference.
    pub fn duplicate(&self) -> RuntimeConfig {
        RuntimeConfig {
            model: self.model.clone(),
            precision: self.precision,
            calibration: self.calibration.clone(),
            basis: self.basis.clone(),
            store: self.store.clone(),
            budget: self.budget.clone(),
            reuse: self.reuse,
            backend: None,
            home: self.home.clone(),
        }
    }
}

/// Loads the model, cost model (calibration, measured patch points, basis) and store of `cfg` and
/// opens the session over them. The store is given the model's basis, so the patches coded in it
/// decode.
pub fn open_runtime(cfg: RuntimeConfig) -> Result<Session> {
    let (model, cost, store) = open_parts(&cfg)?;
    let mut scfg = session_config(&cfg.budget, cost);
    scfg.reuse = cfg.reuse;
    let backend = cfg.backend.unwrap_or_else(|| Box::new(CpuBackend));
    Ok(Session::new(model, store, backend, scfg))
}

/// The model, cost model and store of `cfg`; the store is given the model's basis, so the
/// patches coded in it decode.
fn open_parts(cfg: &RuntimeConfig) -> Result<(Arc<Model>, CostModel, Arc<dyn ChunkStore>)> {
    let model = load_model(&cfg.model, cfg.precision, &cfg.home)?;
    let cost = cost_model(&model, &cfg.calibration, &cfg.basis, &cfg.home)?;
    let bases: Bases = cost.basis.iter().cloned().collect();
    let store = open_store(&cfg.store, &bases)?;
    Ok((model, cost, store))
}

/// The session settings of `budget` under `cost`: patches are the cost model's choice
/// ([`CostModel::patch_config`]) unless the budget fixes their rank.
pub fn session_config(budget: &Budget, cost: CostModel) -> SessionConfig {
    SessionConfig {
        window_tokens: budget.window_tokens,
        patch: match budget.patch_rank {
            Some(rank) => PatchConfig::fixed(rank, DType::F32),
            None => cost.patch_config(),
        },
        cost,
        repair: budget.repair,
        image_max_pixels: budget.screenshot_pixels,
        screenshot_tiles: budget.screenshot_tiles,
        chunk_tokens_max: budget.chunk_tokens.unwrap_or(crate::runtime::CHUNK_TOKENS_MAX),
        ..SessionConfig::default()
    }
}

/// The model of `source`, loaded with `precision` (the fastest this CPU runs when `None`).
pub fn load_model(source: &ModelSource, precision: Option<PrefillPrecision>, home: &Path) -> Result<Arc<Model>> {
    let path = match source {
        ModelSource::Loaded(m) => return Ok(m.clone()),
        ModelSource::Default => kamera_model::fetch(ModelName::Smollm2_135m, home).map_err(model("fetch"))?,
        ModelSource::Known(name) => kamera_model::fetch(*name, home).map_err(model("fetch"))?,
        ModelSource::Path(p) => p.clone(),
    };
    let m = Model::load_with_precision(&path, precision.unwrap_or_else(PrefillPrecision::fastest))
        .map_err(model("load"))?;
    Ok(Arc::new(m))
}

/// The scheduler's cost model for `model`: this machine's rates from `calibration`, the patch
/// points and blind-placement KLs measured for the model (kamera-sched's table, by
/// `ModelFp::of(base_fingerprint)`), and its patch basis. What is missing gets the stated
/// defaults and one warning.
pub fn cost_model(
    model: &Model,
    calibration: &CalibrationSource,
    basis: &BasisSource,
    home: &Path,
) -> Result<CostModel> {
    let mut missing = Vec::new();
    let mut cost = match calibration {
        CalibrationSource::Path(p) => Calibration::read(p, model)?.cost,
        CalibrationSource::Defaults => CostModel::default(),
        CalibrationSource::Installed => {
            let p = Calibration::path(home, model);
            if p.exists() {
                let c = Calibration::read(&p, model)?;
                tracing::info!(path = %p.display(), "cost model calibrated on this machine");
                c.cost
            } else {
                missing.push(
                    "no calibration on this machine (SmolLM2-135M's rates on a 2-core CPU; run `kamera calibrate --model <this model>`)"
                        .to_string(),
                );
                CostModel::default()
            }
        }
    };
    let fp = ModelFp::of(model.base_fingerprint());
    match kamera_sched::measured_points(&fp) {
        Some(points) => cost.patch_points = points,
        None => {
            missing.push("no measured patch points (SmolLM2-135M's)".to_string());
            cost.patch_points = kamera_sched::default_patch_points();
        }
    }
    match kamera_sched::measured_blind_kl(&fp) {
        Some(blind) => {
            cost.recall_blind_kl = blind.recall;
            cost.survivor_blind_kl = blind.survivors;
            cost.read_blind_kl = blind.read;
            cost.blind_kl_window = blind.window;
        }
        None => missing.push(format!(
            "no measured blind-placement KL (predicted {:.2} for recalls, {:.2} for survivors, {:.2} for a question's read: above the KL budget {:.2}, so they are patched or re-prefilled)",
            cost.recall_blind_kl, cost.survivor_blind_kl, cost.read_blind_kl, cost.kl_budget
        )),
    }
    if !missing.is_empty() && first_warning(&fp, &missing) {
        tracing::warn!(model = %fp, "using defaults: {}", missing.join("; "));
    }
    cost.basis = load_basis(model, basis, home)?;
    if let Some(p) = cost.patch_point() {
        tracing::info!(point = %p.label, gap = p.gap, bytes = p.bytes, "recall patches");
    }
    Ok(cost)
}

/// Where an installed basis of `model` lives under `home`.
pub fn installed_basis_path(home: &Path, model: &Model) -> PathBuf {
    let fp = ModelFp::of(model.base_fingerprint()).to_string();
    home.join("bases").join(format!("{}.bin", &fp[..16]))
}

fn load_basis(model: &Model, source: &BasisSource, home: &Path) -> Result<Option<Arc<PatchBasis>>> {
    let path = match source {
        BasisSource::None => return Ok(None),
        BasisSource::Loaded(b) => {
            check_basis(b, model, Path::new("(loaded)"))?;
            return Ok(Some(b.clone()));
        }
        BasisSource::Path(p) => p.clone(),
        BasisSource::Installed => {
            let p = installed_basis_path(home, model);
            if !p.exists() {
                return Ok(None);
            }
            p
        }
    };
    let b = kamera_eval::DeficitBasis::load(&path).map_err(|e| Error::Config {
        what: "patch basis",
        path: path.clone(),
        detail: e.to_string(),
    })?;
    check_basis(&b.basis, model, &path)?;
    tracing::info!(path = %path.display(), "patch basis loaded");
    Ok(Some(b.basis))
}

fn check_basis(b: &PatchBasis, model: &Model, path: &Path) -> Result<()> {
    b.check("patch basis", &model.layout()).map_err(|e| Error::Config {
        what: "patch basis",
        path: path.to_path_buf(),
        detail: format!("not a basis of this model: {e}"),
    })
}

/// The store of `source`; a stack decodes transform-coded records in `bases` (the model's basis,
/// when it has one). A [`StoreSource::Given`] store was configured by its caller.
pub fn open_store(source: &StoreSource, bases: &Bases) -> Result<Arc<dyn ChunkStore>> {
    let (dir, redis, write_behind, tls_ca) = match source {
        StoreSource::Memory => return Ok(Arc::new(MemStore::new())),
        StoreSource::Given(s) => return Ok(s.clone()),
        StoreSource::Stack {
            dir,
            redis,
            write_behind,
            tls_ca,
        } => (dir, redis, write_behind, tls_ca),
    };
    let redis = redis.as_deref();
    if let Some(url) = redis
        && !(url.starts_with("redis://") || url.starts_with("rediss://"))
    {
        return Err(Error::Build {
            detail: format!("store: {url:?} is not a redis:// or rediss:// URL"),
        });
    }
    if redis.is_none() && (write_behind.is_some() || tls_ca.is_some()) {
        return Err(Error::Build {
            detail: "store: write-behind and a TLS CA need a Redis store (redis://... or rediss://...)".into(),
        });
    }
    let path = dir.clone().unwrap_or_else(kamera_store::default_path);
    let opts = StackOptions {
        memory_bytes: MEMORY_TIER_BYTES,
        write_behind: *write_behind,
        tls_ca: tls_ca.clone(),
        bases: bases.clone(),
    };
    // The local sled store may be held by another process: run on memory then. A bad Redis URL
    // is the user's to fix.
    match kamera_store::open_stack_with(&path, redis, &opts) {
        Ok(s) => Ok(s),
        Err(e @ kamera_store::Error::Db { .. }) => {
            tracing::warn!(path = %path.display(), error = %e, "chunk store unavailable; using memory");
            Ok(Arc::new(MemStore::new()))
        }
        Err(e) => Err(Box::new(e).into()),
    }
}

/// Whether this process has not yet warned about these defaults for this model: a bench or a
/// fleet opens a runtime per episode, and the same line once per episode is noise.
fn first_warning(fp: &ModelFp, missing: &[String]) -> bool {
    static WARNED: std::sync::Mutex<Vec<(ModelFp, Vec<String>)>> = std::sync::Mutex::new(Vec::new());
    let mut w = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    let key = (*fp, missing.to_vec());
    if w.contains(&key) {
        return false;
    }
    w.push(key);
    true
}

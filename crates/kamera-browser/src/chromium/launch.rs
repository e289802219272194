//! Launching Chromium: its switches, the profile it runs in, and what is set up on the launch
//! page (request interception for every tab, dialogs, the click hook).

use std::path::{Path, PathBuf};
use std::time::Duration;

use chromiumoxide::cdp::browser_protocol::browser::BrowserContextId;
use chromiumoxide::cdp::browser_protocol::target::CreateTargetParams;
use chromiumoxide::handler::viewport::Viewport;
use chromiumoxide::{Browser as CdpBrowser, BrowserConfig};
use futures::StreamExt;

use super::{ChromiumBrowser, actions, with_timeout};
use crate::confine::Confinement;
use crate::dialogs::Dialogs;
use crate::error::{Error, Result, cdp};
use crate::origin::Origins;

/// chromiumoxide 0.9's DEFAULT_ARGS without `disable-popup-blocking`.
const CHROMIUMOXIDE_DEFAULTS: [&str; 23] = [
    "disable-background-networking",
    "enable-features=NetworkService,NetworkServiceInProcess",
    "disable-background-timer-throttling",
    "disable-backgrounding-occluded-windows",
    "disable-breakpad",
    "disable-client-side-phishing-detection",
    "disable-component-extensions-with-background-pages",
    "disable-default-apps",
    "disable-dev-shm-usage",
    "disable-features=TranslateUI",
    "disable-hang-monitor",
    "disable-ipc-flooding-protection",
    "disable-prompt-on-repost",
    "disable-renderer-backgrounding",
    "disable-sync",
    "force-color-profile=srgb",
    "metrics-recording-only",
    "no-first-run",
    "enable-automation",
    "password-store=basic",
    "use-mock-keychain",
    "enable-blink-features=IdleDetection",
    "lang=en_US",
];

/// How to launch Chromium.
#[derive(Debug, Clone)]
pub struct ChromiumConfig {
    /// The executable; `KAMERA_CHROMIUM` or `/usr/bin/chromium` by default.
    pub executable: PathBuf,
    pub width: u32,
    pub height: u32,
    /// Limit for one browser call (navigation, script, screenshot).
    pub timeout: Duration,
    /// Where navigations may go.
    pub origins: Origins,
    /// Extra Chromium switches (without `--`), e.g. `host-resolver-rules=MAP a.test 127.0.0.1`.
    pub args: Vec<String>,
    /// Where the browser keeps its state and where it runs.
    pub options: BrowserOptions,
}

/// Where a browser keeps its state between runs and where it runs: what `kamera run`'s
/// `--profile`, `--storage-state` and `--browser-url` set. The default is an isolated run: a
/// fresh temporary profile, removed at the end.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BrowserOptions {
    /// A profile folder (Chromium's user-data-dir) kept between launches: cookies and
    /// localStorage persist in it. Created when missing; one browser at a time may use it.
    pub profile: Option<PathBuf>,
    /// A Playwright storageState file ([`crate::StorageState`]): imported at launch when it
    /// exists, written at [`crate::Browser::close`].
    pub storage_state: Option<PathBuf>,
    /// Attach to a running Chromium instead of launching one: its DevTools endpoint,
    /// `ws://HOST:PORT/devtools/browser/ID` or `http://HOST:PORT`. The run opens its tabs in a
    /// browser context of its own (its cookies apart, disposed at close) and leaves the browser
    /// running; `profile` does not apply.
    pub browser_url: Option<String>,
    /// A folder for the run's downloads (created when missing): each completed download is
    /// saved there under its suggested name and listed by [`ChromiumBrowser::downloads`].
    /// Unset: every download is refused. For an attached browser the folder is on its machine.
    pub downloads: Option<PathBuf>,
}

impl ChromiumConfig {
    /// Defaults (800x600 viewport, 20 s per call) for `origins`.
    pub fn new(origins: Origins) -> ChromiumConfig {
        let executable = std::env::var_os("KAMERA_CHROMIUM")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
        ChromiumConfig {
            executable,
            width: 800,
            height: 600,
            timeout: Duration::from_secs(20),
            origins,
            args: Vec::new(),
            options: BrowserOptions::default(),
        }
    }
}

/// A browser process under a running handler loop, not set up yet.
pub(super) struct Started {
    pub(super) browser: CdpBrowser,
    pub(super) handler: tokio::task::JoinHandle<()>,
    pub(super) profile: ProfileDir,
    /// The browser context the run's tabs open in (an attached browser's own, for this run).
    pub(super) context: Option<BrowserContextId>,
}

/// Drives chromiumoxide's handler (it must run before anything else is awaited).
pub(super) fn spawn_handler(mut handler: chromiumoxide::Handler) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(ev) = handler.next().await {
            if let Err(e) = ev {
                tracing::trace!(error = %e, "chromium handler");
            }
        }
    })
}

impl ChromiumBrowser {
    /// Launches Chromium (or, with [`BrowserOptions::browser_url`], attaches to a running one);
    /// fails with [`Error::ChromiumMissing`] (which names scripts/install-chromium.sh) when the
    /// executable is not there.
    pub async fn launch(cfg: ChromiumConfig) -> Result<ChromiumBrowser> {
        let started = match cfg.options.browser_url.clone() {
            Some(url) => super::remote::attach(&cfg, &url).await?,
            None => start(&cfg).await?,
        };
        let Started {
            mut browser,
            handler,
            profile,
            context,
        } = started;
        // Every tab's requests are intercepted from here on, before any page loads.
        let mut confinement = Confinement::start(browser.websocket_address(), cfg.origins.clone()).await?;
        let mut target = CreateTargetParams::new("about:blank");
        target.browser_context_id = context.clone();
        let page = with_timeout("new_page", cfg.timeout, async {
            browser.new_page(target).await.map_err(cdp("new_page"))
        })
        .await?;
        with_timeout("new_page", cfg.timeout, async {
            page.evaluate_on_new_document(actions::HOOK_JS)
                .await
                .map_err(cdp("new_page"))
        })
        .await?;
        let tabs = vec![page.target_id().clone()];
        let set_up = tabs.clone();
        confinement.watch(&page).await?;
        let dialogs = Dialogs::start(&page).await?;
        let downloads = crate::downloads::Downloads::start(
            browser.websocket_address(),
            cfg.options.downloads.as_deref(),
            context.clone(),
        )
        .await?;
        let pid = browser.get_mut_child().and_then(|c| c.as_mut_inner().id());
        let state = cfg.options.storage_state.clone();
        let mut b = ChromiumBrowser {
            cfg,
            browser,
            page,
            handler,
            profile,
            context,
            imported: Vec::new(),
            pid,
            confinement,
            downloads,
            dialogs: vec![dialogs],
            last: None,
            tabs,
            set_up,
            doc_mark: 0,
        };
        if let Some(path) = state.filter(|p| p.exists()) {
            let r = b.import_state_file(&path).await;
            if let Err(e) = b.diagnose(r) {
                let _ = crate::Browser::close(&mut b).await;
                return Err(e);
            }
        }
        Ok(b)
    }
}

/// Starts a local Chromium process in its profile.
async fn start(cfg: &ChromiumConfig) -> Result<Started> {
    if !cfg.executable.exists() {
        return Err(Error::ChromiumMissing {
            path: cfg.executable.display().to_string(),
        });
    }
    let profile = ProfileDir::open(cfg.options.profile.as_deref())?;
    no_prediction(profile.path())?;
    let mut builder = BrowserConfig::builder()
        .chrome_executable(&cfg.executable)
        .user_data_dir(profile.path())
        .window_size(cfg.width, cfg.height)
        .viewport(Viewport {
            width: cfg.width,
            height: cfg.height,
            device_scale_factor: Some(1.0),
            emulating_mobile: false,
            is_landscape: true,
            has_touch: false,
        })
        // Newer Chromium sends events chromiumoxide does not know: hand them to our handler loop
        // (logged at trace) instead of warning about each.
        .surface_invalid_messages()
        .launch_timeout(cfg.timeout)
        .request_timeout(cfg.timeout)
        // chromiumoxide's default switches, less `disable-popup-blocking`: a page's script
        // may not open tabs (they would escape request interception).
        .disable_default_args()
        .args(CHROMIUMOXIDE_DEFAULTS)
        .args([
            "disable-background-networking",
            "disable-component-update",
            "disable-sync",
            "no-first-run",
            "disable-gpu",
            "disable-quic",
            "disable-dev-shm-usage",
            "no-default-browser-check",
            "disable-features=Translate,MediaRouter,OptimizationHints",
            "font-render-hinting=none",
        ]);
    if !cfg.args.is_empty() {
        builder = builder.args(cfg.args.iter().map(String::as_str));
    }
    if is_root() {
        builder = builder.no_sandbox();
    }
    let config = builder
        .build()
        .map_err(|detail| Error::Chromium { op: "config", detail })?;
    let (browser, handler) = with_timeout("launch", cfg.timeout, async {
        CdpBrowser::launch(config).await.map_err(cdp("launch"))
    })
    .await?;
    Ok(Started {
        browser,
        handler: spawn_handler(handler),
        profile,
        context: None,
    })
}

/// The profile a launched browser runs in.
pub(super) enum ProfileDir {
    /// A fresh one, removed when the browser is dropped.
    Temp(tempfile::TempDir),
    /// One kept between launches.
    Kept(PathBuf),
    /// None of ours: the browser runs elsewhere.
    Remote,
}

impl ProfileDir {
    fn open(kept: Option<&Path>) -> Result<ProfileDir> {
        let io = |source| Error::Io {
            op: "ChromiumBrowser::launch",
            source,
        };
        match kept {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(io)?;
                if let Some(pid) = holder(dir) {
                    return Err(Error::Invalid {
                        op: "ChromiumBrowser::launch",
                        detail: format!(
                            "the profile {} is in use by another browser (process {pid}): one run at a time may use a profile",
                            dir.display()
                        ),
                    });
                }
                Ok(ProfileDir::Kept(dir.to_path_buf()))
            }
            None => Ok(ProfileDir::Temp(
                tempfile::Builder::new()
                    .prefix("kamera-chromium-")
                    .tempdir()
                    .map_err(io)?,
            )),
        }
    }

    pub(super) fn path(&self) -> &Path {
        match self {
            ProfileDir::Temp(t) => t.path(),
            ProfileDir::Kept(p) => p,
            ProfileDir::Remote => Path::new(""),
        }
    }
}

/// The live process holding the profile at `dir`, if any: Chromium's `SingletonLock` is a
/// symbolic link to `HOST-PID` (a stale one, its process gone, is taken over by Chromium).
fn holder(dir: &Path) -> Option<u32> {
    let target = std::fs::read_link(dir.join("SingletonLock")).ok()?;
    let pid: u32 = target.to_str()?.rsplit('-').next()?.parse().ok()?;
    Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
}

/// Turns off Chromium's network prediction in the profile at `dir` (its preference, kept in
/// `Default/Preferences`): no preconnect or DNS prefetch, from `<link rel=preconnect>`, a hovered
/// link or a navigation's learned hints, can open a connection that request interception never
/// sees.
fn no_prediction(dir: &Path) -> Result<()> {
    let io = |source| Error::Io { op: "profile", source };
    let path = dir.join("Default").join("Preferences");
    let mut prefs: serde_json::Value = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| serde_json::json!({}));
    // 2: never predict (NETWORK_PREDICTION_NEVER).
    prefs["net"] = match prefs.get("net").cloned() {
        Some(serde_json::Value::Object(mut net)) => {
            net.insert("network_prediction_options".into(), 2.into());
            serde_json::Value::Object(net)
        }
        _ => serde_json::json!({ "network_prediction_options": 2 }),
    };
    std::fs::create_dir_all(dir.join("Default")).map_err(io)?;
    std::fs::write(&path, serde_json::to_vec(&prefs).unwrap_or_default()).map_err(io)
}

fn is_root() -> bool {
    // Chromium refuses to start sandboxed as root; the effective uid decides.
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

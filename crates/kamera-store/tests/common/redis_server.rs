//! A `redis-server` of the test's own on a free loopback port in a temp dir, SIGKILLed when
//! dropped; and a three-primary Redis Cluster. Fails (never skips) when redis-server is missing.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

/// A `RedisStore` on `url` under `prefix`, f32 kept exact, writing pieces of `piece_bytes`.
pub fn store(url: &str, prefix: &str, piece_bytes: usize) -> kamera_store::RedisStore {
    kamera_store::RedisStore::open(kamera_store::RedisConfig {
        prefix: prefix.into(),
        piece_bytes,
        timeout: Duration::from_secs(2),
        dtype: None,
        ..kamera_store::RedisConfig::at(url)
    })
    .expect("open")
}

/// Fails with the fix when the binaries are missing.
pub fn require(bin: &str) -> Result<()> {
    match Command::new(bin).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => bail!("{bin} --version failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => bail!(
            "{bin} is not installed ({e}): run scripts/install-redis.sh (Debian's redis-server, which CI \
             installs); the Redis tests need a real server"
        ),
    }
}

/// A port nothing listens on now (the OS's pick for 127.0.0.1:0).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    args: Vec<String>,
}

impl RedisServer {
    /// Starts a server with `extra` settings (`["--appendonly", "yes"]`, ...): no RDB snapshots,
    /// loopback only.
    pub fn start(extra: &[&str]) -> Result<RedisServer> {
        RedisServer::start_on(free_port()?, extra)
    }

    /// [`RedisServer::start`] on `port`.
    pub fn start_on(port: u16, extra: &[&str]) -> Result<RedisServer> {
        require("redis-server")?;
        let dir = tempfile::tempdir()?;
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &dir.path().display().to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            "redis.log",
            "--daemonize",
            "no",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut s = RedisServer {
            port,
            child: None,
            dir,
            args,
        };
        s.spawn()?;
        Ok(s)
    }

    fn spawn(&mut self) -> Result<()> {
        let child = Command::new("redis-server")
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning redis-server")?;
        self.child = Some(child);
        self.wait_ready()
    }

    /// Waits until the server answers PING (after loading its data).
    fn wait_ready(&mut self) -> Result<()> {
        let t0 = Instant::now();
        loop {
            if let Ok(mut c) = self.client().get_connection_with_timeout(Duration::from_secs(1)) {
                match redis::cmd("PING").query::<String>(&mut c) {
                    // A server with a password answers too (loading, it says LOADING).
                    Ok(_) => return Ok(()),
                    Err(e) if e.code() == Some("NOAUTH") => return Ok(()),
                    Err(_) => {}
                }
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("redis-server on port {} exited ({status}): {}", self.port, self.log());
            }
            ensure!(
                t0.elapsed() < Duration::from_secs(20),
                "redis-server on port {} did not answer: {}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("url")
    }

    /// A raw connection (for damaging values and reading server state).
    pub fn raw(&self) -> redis::Connection {
        self.client().get_connection().expect("raw connection")
    }

    /// SIGKILL, and wait for the process.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again with the same port, directory and settings.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Three cluster-enabled primaries joined with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Result<RedisCluster> {
        require("redis-cli")?;
        // Six distinct ports (three clients', three cluster buses'), held until all are chosen.
        let held: Vec<TcpListener> = (0..6)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<Result<_, _>>()?;
        let ports: Vec<u16> = held
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<Result<_, _>>()?;
        drop(held);
        let mut nodes = Vec::new();
        for i in 0..3 {
            let bus = ports[3 + i].to_string();
            nodes.push(RedisServer::start_on(
                ports[i],
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    &bus,
                    "--cluster-node-timeout",
                    "2000",
                ],
            )?);
        }
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .context("redis-cli --cluster create")?;
        ensure!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let t0 = Instant::now();
        for n in &nodes {
            loop {
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut n.raw())?;
                if info.lines().any(|l| l.trim() == "cluster_state:ok") {
                    break;
                }
                ensure!(t0.elapsed() < Duration::from_secs(30), "cluster not ok: {info}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(RedisCluster { nodes })
    }
}

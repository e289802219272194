//! `rediss://`: a `redis-server` with a TLS port and a self-signed certificate generated here;
//! records round-trip over TLS when the store trusts that certificate (`RedisConfig::tls_ca`),
//! and the connection is refused when it does not (the server is verified). Skipped, saying so,
//! where the installed redis-server was built without TLS.

mod common;
#[path = "common/redis_server.rs"]
mod redis_server;

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use kamera_store::{ChunkStore, RedisConfig, RedisStore};
use redis_server::{RedisServer, free_port, require};

/// Whether this redis-server has TLS: one with it fails on the missing files, one without
/// rejects the `tls-port` directive itself.
fn redis_has_tls() -> Result<bool> {
    require("redis-server")?;
    let out = Command::new("redis-server")
        .args(["--port", "0", "--tls-port", "1", "--save", ""])
        .args([
            "--tls-cert-file",
            "/nonexistent/c.pem",
            "--tls-key-file",
            "/nonexistent/k.pem",
        ])
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(!(text.contains("Bad directive") || text.contains("not supported") || text.contains("not built")))
}

fn tls_store(port: u16, ca: Option<std::path::PathBuf>) -> Result<RedisStore> {
    Ok(RedisStore::open(RedisConfig {
        tls_ca: ca,
        prefix: "tls".into(),
        piece_bytes: 1024,
        timeout: Duration::from_secs(2),
        dtype: None,
        ..RedisConfig::at(format!("rediss://127.0.0.1:{port}/"))
    })?)
}

#[test]
fn records_round_trip_over_tls_and_an_unknown_certificate_is_refused() -> Result<()> {
    if !redis_has_tls()? {
        kamera_ops::testkit::skip(
            "kamera-store redis_tls::records_round_trip_over_tls_and_an_unknown_certificate_is_refused",
            "the installed redis-server has no TLS support (no tls-port directive)",
        );
        return Ok(());
    }
    let certs = tempfile::tempdir()?;
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
    let (crt, key) = (certs.path().join("server.crt"), certs.path().join("server.key"));
    std::fs::write(&crt, cert.cert.pem())?;
    std::fs::write(&key, cert.key_pair.serialize_pem())?;
    let tls_port = free_port()?;
    let (port, crt_s, key_s) = (
        tls_port.to_string(),
        crt.display().to_string(),
        key.display().to_string(),
    );
    let _srv = RedisServer::start(&[
        "--tls-port",
        &port,
        "--tls-cert-file",
        &crt_s,
        "--tls-key-file",
        &key_s,
        "--tls-ca-cert-file",
        &crt_s,
        "--tls-auth-clients",
        "no",
    ])?;

    let s = tls_store(tls_port, Some(crt.clone()))?;
    s.ping().context("ping over TLS")?;
    for i in 0..6 {
        let (k, r) = common::nth(i);
        s.put(&k, r)?;
    }
    let again = tls_store(tls_port, Some(crt))?;
    for i in 0..6 {
        let (k, r) = common::nth(i);
        assert_eq!(*again.get(&k)?.context("record over TLS")?, r, "record {i}");
    }
    assert_eq!(again.usage()?.records(), 6);

    // The system's roots do not know this certificate: refused, typed as unavailable.
    let untrusted = tls_store(tls_port, None)?;
    let e = untrusted.ping().expect_err("an unknown certificate was accepted");
    assert!(e.is_unavailable(), "{e}");
    // Plain text to the TLS port is no way in either.
    let plain = redis_server::store(&format!("redis://127.0.0.1:{tls_port}/"), "tls", 1024);
    assert!(plain.ping().is_err());
    Ok(())
}

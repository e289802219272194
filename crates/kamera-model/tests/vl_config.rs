//! Qwen2.5-VL config layouts: the tiny checkpoint's config (saved by transformers 4.57) rewritten
//! as transformers 5 writes it (`text_config.rope_parameters` with `rope_theta` inside, no
//! `rope_scaling`) and as the released checkpoints lay it out (text fields at the top level)
//! loads to the same model, bit for bit; a config missing a value that changes the math is an
//! error naming it, never a default.

use std::path::PathBuf;

use anyhow::Result;
use kamera_model::Model;
use serde_json::{Value, json};

mod common;
use common::{tiny_vl as tiny, vl_text_logits};

fn original() -> Result<Value> {
    Ok(serde_json::from_str(&std::fs::read_to_string(
        tiny().join("config.json"),
    )?)?)
}

/// A copy of the tiny checkpoint (weights, tokenizer) with `config` as its config.json.
fn with_config(name: &str, config: &Value) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("kamera-vlcfg-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    for e in std::fs::read_dir(tiny())? {
        let p = e?.path();
        std::fs::copy(&p, dir.join(p.file_name().expect("a file")))?;
    }
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(config)?)?;
    Ok(dir)
}

/// transformers 5's layout: `rope_parameters` {mrope_section, rope_theta, rope_type}.
fn transformers5(mut c: Value) -> Value {
    let t = c["text_config"].as_object_mut().expect("text_config");
    let sections = t.remove("rope_scaling").expect("rope_scaling")["mrope_section"].clone();
    let theta = t.remove("rope_theta").expect("rope_theta");
    t.insert(
        "rope_parameters".into(),
        json!({"mrope_section": sections, "rope_theta": theta, "rope_type": "default"}),
    );
    c["transformers_version"] = json!("5.0.0");
    c
}

/// The released checkpoints' layout: the text model's fields at the top level.
fn flat(mut c: Value) -> Value {
    let t = c
        .as_object_mut()
        .expect("object")
        .remove("text_config")
        .expect("text_config");
    for (k, v) in t.as_object().expect("text_config object") {
        if k != "model_type" {
            c[k.as_str()] = v.clone();
        }
    }
    c
}

#[test]
fn transformers5_and_flat_layouts_load_the_same_model() -> Result<()> {
    let reference = vl_text_logits(&Model::load(&tiny())?)?;
    for (name, config) in [("t5", transformers5(original()?)), ("flat", flat(original()?))] {
        let dir = with_config(name, &config)?;
        let got = vl_text_logits(&Model::load(&dir)?)?;
        assert_eq!(got, reference, "{name}: logits differ from the transformers 4 layout's");
        std::fs::remove_dir_all(dir)?;
    }
    Ok(())
}

/// Loads the tiny checkpoint under `config` and returns the error it must give.
fn load_error(name: &str, config: Value) -> Result<String> {
    let dir = with_config(name, &config)?;
    let err = match Model::load(&dir) {
        Ok(_) => anyhow::bail!("{name}: the config loaded"),
        Err(e) => e.to_string(),
    };
    std::fs::remove_dir_all(dir)?;
    Ok(err)
}

#[test]
fn values_that_change_the_math_are_never_defaulted() -> Result<()> {
    // No rotary base, in either layout.
    let mut c = original()?;
    c["text_config"].as_object_mut().unwrap().remove("rope_theta");
    let err = load_error("no-theta4", c)?;
    assert!(err.contains("rope_theta") && err.contains("missing"), "{err}");
    let mut c = transformers5(original()?);
    c["text_config"]["rope_parameters"]
        .as_object_mut()
        .unwrap()
        .remove("rope_theta");
    let err = load_error("no-theta5", c)?;
    assert!(err.contains("rope_theta") && err.contains("missing"), "{err}");

    let mut c = original()?;
    c["text_config"].as_object_mut().unwrap().remove("rms_norm_eps");
    let err = load_error("no-eps", c)?;
    assert!(err.contains("rms_norm_eps"), "{err}");

    let mut c = original()?;
    c["text_config"].as_object_mut().unwrap().remove("rope_scaling");
    let err = load_error("no-rope", c)?;
    assert!(err.contains("rope_parameters") && err.contains("rope_scaling"), "{err}");

    let mut c = transformers5(original()?);
    c["text_config"]["rope_parameters"]["rope_type"] = json!("yarn");
    let err = load_error("yarn", c)?;
    assert!(err.contains("yarn"), "{err}");

    let mut c = original()?;
    c["vision_config"]
        .as_object_mut()
        .unwrap()
        .remove("fullatt_block_indexes");
    let err = load_error("no-fullatt", c)?;
    assert!(err.contains("fullatt_block_indexes"), "{err}");
    Ok(())
}

//! The device transformer's CPU reference (kamera-gpu's `reference_prefill`, the forward the
//! CUDA kernels are checked against) on real weights against this crate's candle runner; and
//! the named shapes the GPU bench uses against the real configurations.

mod common;

use kamera_gpu::{ModelSpec, reference_prefill};
use kamera_model::ModelName;

#[test]
fn device_reference_matches_candle_runner_on_real_weights() -> anyhow::Result<()> {
    for name in [ModelName::Smollm2_135m, ModelName::Gemma3_270m] {
        let model = common::load(name)?;
        let ids = model
            .tokenizer()
            .encode("The capital of France is Paris, and the capital of Italy is")?;
        let ids = &ids[..ids.len().min(12)];
        let want = model.prefill(ids, 0, &model.empty_context())?;
        let spec = model.device_spec();
        let (got, kvs) = reference_prefill(&spec, &model.host_weights()?, ids);
        let kl = common::kl(&want.logits, &got);
        eprintln!("{name}: KL(candle || device reference) = {kl:.2e}");
        assert!(kl < 2e-2, "{name}: KL {kl}");
        assert_eq!(
            common::argmax(&want.logits),
            common::argmax(&got),
            "{name}: next token differs"
        );
        // K of the last layer: the RoPE layout and QK-norm agree.
        let k = want.chunk.layers().last().unwrap().k.to_f32_vec();
        let e = common::max_abs(&k, &kvs.last().unwrap().0);
        let scale = k.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(e < 0.05 * scale, "{name}: last-layer K differs by {e} (scale {scale})");
    }
    Ok(())
}

#[test]
fn named_device_shapes_are_the_real_configurations() -> anyhow::Result<()> {
    for (name, shape) in [
        (ModelName::Qwen25_05b, ModelSpec::qwen25_05b()),
        (ModelName::Smollm2_135m, ModelSpec::smollm2_135m()),
    ] {
        let spec = common::load(name)?.device_spec();
        assert_eq!(spec, shape, "{name}");
    }
    Ok(())
}

//! `kamera generate`: greedy or sampled generation, streamed to stdout.

use std::io::Write;

use anyhow::Result;
use clap::Args;
use kamera_model::Sampling;

#[derive(Args)]
pub struct GenerateArgs {
    /// Model name or path to a .gguf file.
    #[arg(long)]
    model: String,
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Wrap the prompt in the model's chat template (one user turn).
    #[arg(long)]
    chat: bool,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep the K most likely tokens when sampling (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub fn run(a: GenerateArgs) -> Result<()> {
    let model = crate::models::load(&a.model)?;
    let prompt = if a.chat {
        model.chat_prompt(&a.prompt)
    } else {
        a.prompt.clone()
    };
    let ids = model.tokenizer().encode(&prompt)?;
    let stop = if a.chat { model.chat_stop_tokens() } else { Vec::new() };
    let sampling = if a.temperature > 0.0 {
        Sampling::Sample {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
        }
    } else {
        Sampling::Greedy
    };
    let start = std::time::Instant::now();
    let mut all = Vec::new();
    let mut printed = 0;
    let mut stdout = std::io::stdout();
    let mut err = None;
    let out = model.generate(&ids, a.max_tokens, sampling, &stop, |t| {
        all.push(t);
        // Print whole characters only: decode everything so far and emit the new suffix.
        match model.tokenizer().decode(&all, true) {
            Ok(text) => {
                let text = text.trim_end_matches('\u{FFFD}');
                if text.len() > printed && text.is_char_boundary(printed) {
                    let _ = write!(stdout, "{}", &text[printed..]);
                    let _ = stdout.flush();
                    printed = text.len();
                }
            }
            Err(e) => err = Some(e),
        }
    })?;
    if let Some(e) = err {
        return Err(e.into());
    }
    let text = model.tokenizer().decode(&out, true)?;
    if text.len() > printed {
        print!("{}", &text[printed.min(text.len())..]);
    }
    println!();
    let secs = start.elapsed().as_secs_f64();
    tracing::info!(prompt_tokens = ids.len(), new_tokens = out.len(), secs, "generated");
    Ok(())
}

//! `kamera logits`: a prompt's token ids and the top-K logits at its last position.

use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct LogitsArgs {
    /// Model name or path to a .gguf file.
    #[arg(long)]
    model: String,
    #[arg(long)]
    prompt: String,
    /// How many of the highest logits to print.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Print `{"ids": [...], "top": [[token_id, logit], ...]}` on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: LogitsArgs) -> Result<()> {
    let model = crate::models::load(&a.model)?;
    let ids = model.tokenizer().encode(&a.prompt)?;
    anyhow::ensure!(!ids.is_empty(), "the prompt tokenizes to no tokens");
    let out = model.prefill(&ids, 0, &model.empty_context())?;
    let mut order: Vec<usize> = (0..out.logits.len()).collect();
    order.sort_unstable_by(|&x, &y| out.logits[y].total_cmp(&out.logits[x]).then(x.cmp(&y)));
    order.truncate(a.top);
    if a.json {
        println!("{}", json_line(&ids, &order, &out.logits));
    } else {
        println!("ids: {ids:?}");
        for &i in &order {
            let text = model.tokenizer().decode(&[i as u32], false)?;
            println!("{i:>8} {:>10.4} {text:?}", out.logits[i]);
        }
    }
    Ok(())
}

/// `{"ids": [1, 2], "top": [[7, 17.5], ...]}`, spaced as Python's json.dumps writes it.
fn json_line(ids: &[u32], order: &[usize], logits: &[f32]) -> String {
    let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let top: Vec<String> = order
        .iter()
        .map(|&i| format!("[{i}, {}]", serde_json::json!(logits[i])))
        .collect();
    format!("{{\"ids\": [{}], \"top\": [{}]}}", ids.join(", "), top.join(", "))
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_line_is_valid_and_spaced() {
        let line = super::json_line(&[1, 2], &[1, 0], &[0.5, 2.0]);
        assert_eq!(line, r#"{"ids": [1, 2], "top": [[1, 2.0], [0, 0.5]]}"#);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["top"][0][0], 1);
    }
}

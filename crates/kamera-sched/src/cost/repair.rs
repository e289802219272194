//! What survivors of an eviction and a question's read of pages placed blind get: read blind,
//! or prefilled again in place (and their patches kept where reuse pays), by the model's blind
//! KL predicted at the window's size.

use super::{Choice, CostModel, Decision, DecisionOp};

impl CostModel {
    /// `kl`, a blind KL measured at [`CostModel::blind_kl_window`], predicted for a window of
    /// `window` tokens (in proportion to the stale KV a read crosses).
    fn at_window(&self, kl: f64, window: usize) -> f64 {
        if self.blind_kl_window == 0 || window == 0 {
            return kl;
        }
        kl * window as f64 / self.blind_kl_window as f64
    }

    /// Predicted KL of survivors of an eviction re-rotated blind, in a window of `window` tokens.
    pub fn survivor_kl(&self, window: usize) -> f64 {
        self.at_window(self.survivor_blind_kl, window)
    }

    /// Predicted KL of a question's read of a page placed blind, in a window of `window` tokens.
    pub fn read_kl(&self, window: usize) -> f64 {
        self.at_window(self.read_blind_kl, window)
    }

    /// Whether survivors of an eviction in a window of `window` tokens get repaired: their
    /// predicted blind KL is over the budget (the rule [`CostModel::survivors`] decides by).
    pub fn repairs_survivors(&self, window: usize) -> bool {
        self.survivor_kl(window) > self.kl_budget
    }

    /// What happens to the survivors of an eviction (`n` tokens from `ctx` on, in a window of
    /// `window` tokens): re-rotated blind (exact as rotation, their KV still conditioned on the
    /// evicted chunk), or repaired (prefilled again in place: before the chunk an insert or a
    /// recall places after them, else in the background, [`crate::Window::repair`]), by
    /// predicted KL ([`CostModel::survivor_kl`]) against the budget. A repair also keeps each
    /// survivor's difference to its canonical KV as the patch for its new context
    /// (`PrefillKeepPatch`: SVDs, no extra forward pass) where `expected_reuses` (the window's
    /// own record) times the repair a recurring layout then skips outweighs the SVDs.
    pub fn survivors(&self, n: usize, ctx: usize, window: usize, expected_reuses: f64) -> Decision {
        let blind = self.reuse(n);
        let repair = blind + self.prefill(n, ctx);
        let options = vec![
            (Choice::Blind, blind),
            (Choice::Reprefill, repair),
            (Choice::PrefillKeepPatch, repair + self.svd(n)),
        ];
        let kl = self.survivor_kl(window);
        let (choice, reason) = if !self.repairs_survivors(window) {
            (Choice::Blind, self.within("re-rotated only", kl))
        } else {
            let saved = expected_reuses * self.prefill(n, ctx);
            let over = format!(
                "prefilled again in place before what follows them is read: blind survivors' predicted KL {kl:.2e} at window {window} is over the budget {:.2e}",
                self.kl_budget
            );
            self.keep_or_not(over, n, saved, expected_reuses)
        };
        Decision {
            op: DecisionOp::Survivors,
            chunk: None,
            choice,
            options,
            reason,
        }
    }

    /// The reason for a blind choice within the budget.
    fn within(&self, what: &str, kl: f64) -> String {
        format!("{what}: predicted KL {kl:.2e} within the budget {:.2e}", self.kl_budget)
    }

    /// A prefill again in place that keeps its patch where `saved` (µs over `expected_reuses`)
    /// outweighs the SVDs of `n` tokens, else a prefill alone.
    fn keep_or_not(&self, over: String, n: usize, saved: f64, expected_reuses: f64) -> (Choice, String) {
        let svd = self.svd(n) / 1000.0;
        if saved > self.svd(n) {
            (
                Choice::PrefillKeepPatch,
                format!(
                    "{over}; patch kept: {svd:.1} ms of SVD saves {:.1} ms over {expected_reuses:.2} expected reuses",
                    saved / 1000.0
                ),
            )
        } else {
            (
                Choice::Reprefill,
                format!(
                    "{over}; no patch kept: {svd:.1} ms of SVD would save {:.1} ms over {expected_reuses:.2} expected reuses",
                    saved / 1000.0
                ),
            )
        }
    }

    /// What a question's read of pages placed blind (`n` tokens, the first at `ctx`, in a window
    /// of `window` tokens) gets: read as placed, or those pages prefilled again in place before
    /// the answer (on the path to the first token: the answer is what must be exact), by
    /// predicted KL ([`CostModel::read_kl`]) against the budget. A
    /// repair also keeps its difference to the canonical KV as the patch for this context
    /// (`PrefillKeepPatch`: an SVD in the background, no extra forward pass) where the expected
    /// reuses of a patch (`expected_reuses`, the window's own record) times the repair a later
    /// recall into the same context then skips outweigh the SVD.
    pub fn read(&self, n: usize, ctx: usize, window: usize, expected_reuses: f64) -> Decision {
        let prefill = self.prefill(n, ctx);
        let keep = prefill + self.svd(n);
        let options = vec![
            (Choice::Blind, 0.0),
            (Choice::Reprefill, prefill),
            (Choice::PrefillKeepPatch, keep),
        ];
        let kl = self.read_kl(window);
        let (choice, reason) = if kl <= self.kl_budget {
            (Choice::Blind, self.within("read as placed", kl))
        } else {
            let over = format!(
                "prefilled again in place before the answer (a read of a page placed blind has predicted KL {kl:.2e} at window {window}, over the budget {:.2e})",
                self.kl_budget
            );
            self.keep_or_not(over, n, expected_reuses * prefill, expected_reuses)
        };
        Decision {
            op: DecisionOp::Read,
            chunk: None,
            choice,
            options,
            reason,
        }
    }
}

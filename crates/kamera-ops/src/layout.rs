//! KV layouts: MHA, GQA/MQA and MLA described by shape alone (KAMERA.md "Attention families").
//! For MLA the K channel holds the decoupled k_rope and the V channel the position-free latent.

use crate::error::{Result, invalid, shape};
use crate::rope::RopeSpec;

/// Attention family of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Attention {
    /// Multi-head attention: one KV head per query head.
    Mha { heads: usize },
    /// Grouped-query attention (MQA when kv_heads = 1).
    Gqa { heads: usize, kv_heads: usize },
    /// DeepSeek-V2 latent attention: the cache holds c_KV (`latent_dim`, no position) and a
    /// single decoupled rotary key shared by all heads (`rope_dim`).
    Mla {
        heads: usize,
        latent_dim: usize,
        rope_dim: usize,
    },
}

/// Shape of one chunk's cached KV in every layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvLayout {
    pub attention: Attention,
    /// Key head dim (MHA/GQA; unused by MLA).
    pub head_dim: usize,
    /// Value head dim (MHA/GQA; unused by MLA).
    pub v_head_dim: usize,
    pub n_layers: usize,
}

impl KvLayout {
    pub fn mha(n_layers: usize, heads: usize, head_dim: usize) -> KvLayout {
        KvLayout {
            attention: Attention::Mha { heads },
            head_dim,
            v_head_dim: head_dim,
            n_layers,
        }
    }
    pub fn gqa(n_layers: usize, heads: usize, kv_heads: usize, head_dim: usize) -> KvLayout {
        KvLayout {
            attention: Attention::Gqa { heads, kv_heads },
            head_dim,
            v_head_dim: head_dim,
            n_layers,
        }
    }
    pub fn mla(n_layers: usize, heads: usize, latent_dim: usize, rope_dim: usize) -> KvLayout {
        KvLayout {
            attention: Attention::Mla {
                heads,
                latent_dim,
                rope_dim,
            },
            head_dim: rope_dim,
            v_head_dim: latent_dim,
            n_layers,
        }
    }

    /// Query heads.
    pub fn heads(&self) -> usize {
        match self.attention {
            Attention::Mha { heads } | Attention::Gqa { heads, .. } | Attention::Mla { heads, .. } => heads,
        }
    }

    /// Cached key heads (1 for MLA's shared k_rope).
    pub fn kv_heads(&self) -> usize {
        match self.attention {
            Attention::Mha { heads } => heads,
            Attention::Gqa { kv_heads, .. } => kv_heads,
            Attention::Mla { .. } => 1,
        }
    }

    /// Features per token in the K channel.
    pub fn k_features(&self) -> usize {
        match self.attention {
            Attention::Mla { rope_dim, .. } => rope_dim,
            _ => self.kv_heads() * self.head_dim,
        }
    }

    /// Features per token in the V channel (MLA: the latent c_KV).
    pub fn v_features(&self) -> usize {
        match self.attention {
            Attention::Mla { latent_dim, .. } => latent_dim,
            _ => self.kv_heads() * self.v_head_dim,
        }
    }

    /// (number of rotary head vectors per K row, dims of each).
    pub fn rope_heads(&self) -> (usize, usize) {
        match self.attention {
            Attention::Mla { rope_dim, .. } => (1, rope_dim),
            _ => (self.kv_heads(), self.head_dim),
        }
    }

    /// Checks the shape is consistent.
    pub fn validate(&self) -> Result<()> {
        const OP: &str = "KvLayout::validate";
        let bad = match self.attention {
            Attention::Mha { heads } => heads == 0,
            Attention::Gqa { heads, kv_heads } => kv_heads == 0 || heads == 0 || heads % kv_heads != 0,
            Attention::Mla {
                heads,
                latent_dim,
                rope_dim,
            } => heads == 0 || latent_dim == 0 || rope_dim == 0,
        };
        if bad || self.n_layers == 0 || self.head_dim == 0 || self.v_head_dim == 0 {
            return Err(invalid(
                OP,
                "layout",
                format!("{self:?}: heads must be > 0 and divisible by kv_heads; dims and layers > 0"),
            ));
        }
        Ok(())
    }

    /// Checks that `rope` rotates this layout's key heads.
    pub fn check_rope(&self, op: &'static str, rope: &RopeSpec) -> Result<()> {
        self.validate()?;
        rope.validate()?;
        let (_, dim) = self.rope_heads();
        if rope.head_dim != dim {
            return Err(shape(op, "RopeSpec::head_dim", dim, rope.head_dim));
        }
        if rope.bases.len() > 1 && rope.bases.len() != self.n_layers {
            return Err(shape(op, "per-layer RoPE bases", self.n_layers, rope.bases.len()));
        }
        Ok(())
    }
}

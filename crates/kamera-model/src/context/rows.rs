//! The in-place CPU ops that write a context's rows: reused chunk rows (relocated and patched
//! straight into the head-first buffers) and one appended row.

use kamera_ops::{Placement, RopeSpec};

/// Writes the reused rows of one layer's channel into a head-first `[groups, cap, width]`
/// context buffer (job: a placed chunk, its first row, its shift).
pub(super) struct PlaceRows<'a> {
    pub(super) jobs: &'a [(Placement<'a>, usize, i64)],
    pub(super) rope: Option<&'a RopeSpec>,
    pub(super) layer: usize,
    pub(super) v_channel: bool,
    pub(super) groups: usize,
    pub(super) cap: usize,
}

impl candle_core::InplaceOp1 for PlaceRows<'_> {
    fn name(&self) -> &'static str {
        "place-rows"
    }

    fn cpu_fwd(&self, storage: &mut candle_core::CpuStorage, layout: &candle_core::Layout) -> candle_core::Result<()> {
        let candle_core::CpuStorage::F32(buf) = storage else {
            candle_core::bail!("place-rows: the context buffer is not f32");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("place-rows: the context buffer is not contiguous");
        };
        let buf = &mut buf[start..end];
        let (g, cap) = (self.groups, self.cap);
        let width = buf.len() / (g * cap).max(1);
        for (part, row0, delta) in self.jobs {
            match self.rope {
                // Straight into the head-first rows (no scratch block, no copy).
                Some(rope) => kamera_ops::reuse_heads(
                    part.chunk,
                    part.patch,
                    rope,
                    self.layer,
                    self.v_channel,
                    *delta,
                    buf,
                    kamera_ops::Heads {
                        groups: g,
                        cap,
                        row0: *row0,
                    },
                )
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?,
                None if *delta == 0 && part.patch.is_none() => {
                    let kv = &part.chunk.layers()[self.layer];
                    let m = if self.v_channel { &kv.v } else { &kv.k };
                    let rows = match m.data() {
                        kamera_ops::Buf::F32(d) => std::borrow::Cow::Borrowed(d.as_slice()),
                        _ => std::borrow::Cow::Owned(m.to_f32_vec()),
                    };
                    // Each row's `g · width` values, head by head to their rows.
                    for (t, row) in rows.chunks_exact((g * width).max(1)).enumerate() {
                        for (h, src) in row.chunks_exact(width.max(1)).enumerate() {
                            let at = (h * cap + row0 + t) * width;
                            buf[at..at + width].copy_from_slice(src);
                        }
                    }
                }
                None => candle_core::bail!("place-rows: a shifted or patched part needs the RoPE spec"),
            }
        }
        Ok(())
    }
}

/// Writes one row (`groups · width` values) at `row` of a head-first `[groups, cap, width]`
/// context buffer.
pub(super) struct PutRow<'a> {
    pub(super) src: &'a [f32],
    pub(super) groups: usize,
    pub(super) cap: usize,
    pub(super) row: usize,
}

impl candle_core::InplaceOp1 for PutRow<'_> {
    fn name(&self) -> &'static str {
        "put-row"
    }

    fn cpu_fwd(&self, storage: &mut candle_core::CpuStorage, layout: &candle_core::Layout) -> candle_core::Result<()> {
        let candle_core::CpuStorage::F32(buf) = storage else {
            candle_core::bail!("put-row: the context buffer is not f32");
        };
        let width = self.src.len() / self.groups.max(1);
        if layout.start_offset() != 0 || buf.len() < self.groups * self.cap * width || self.row >= self.cap {
            candle_core::bail!("put-row: row {} does not fit the context buffer", self.row);
        }
        for (h, src) in self.src.chunks_exact(width.max(1)).enumerate() {
            let at = (h * self.cap + self.row) * width;
            buf[at..at + width].copy_from_slice(src);
        }
        Ok(())
    }
}

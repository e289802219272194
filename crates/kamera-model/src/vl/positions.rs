//! Qwen2.5-VL index arithmetic: the ViT's 2-D rotary ids and attention windows, and the LLM's
//! 3-D M-RoPE position ids (text after an image resumes at the image's largest position + 1).

use crate::error::{Error, Result};

/// An image's grid in patches: temporal, height, width.
pub type Grid = [usize; 3];

/// (row, column) of every patch, in the order the preprocessor flattens them: merge blocks
/// row-major, and inside a block its `merge x merge` patches row-major; repeated per frame.
pub fn patch_rows_cols(grid: Grid, merge: usize) -> Vec<(usize, usize)> {
    let [t, h, w] = grid;
    let mut out = Vec::with_capacity(t * h * w);
    for _ in 0..t {
        for bh in 0..h / merge {
            for bw in 0..w / merge {
                for ih in 0..merge {
                    for iw in 0..merge {
                        out.push((bh * merge + ih, bw * merge + iw));
                    }
                }
            }
        }
    }
    out
}

/// Window attention layout of one image: the merged tokens in window order (`index[i]` is the
/// merged token placed i-th) and the window boundaries in patches (`cu[0] = 0`, increasing).
pub fn window_index(grid: Grid, merge: usize, window: usize) -> (Vec<usize>, Vec<usize>) {
    let [t, h, w] = grid;
    let (gh, gw) = (h / merge, w / merge);
    let (nh, nw) = (gh.div_ceil(window), gw.div_ceil(window));
    let unit = merge * merge;
    let mut index = Vec::with_capacity(t * gh * gw);
    let mut cu = vec![0];
    for f in 0..t {
        for wy in 0..nh {
            for wx in 0..nw {
                let before = index.len();
                for y in wy * window..((wy + 1) * window).min(gh) {
                    for x in wx * window..((wx + 1) * window).min(gw) {
                        index.push(f * gh * gw + y * gw + x);
                    }
                }
                let n = index.len() - before;
                if n > 0 {
                    cu.push(cu.last().copied().unwrap_or(0) + n * unit);
                }
            }
        }
    }
    (index, cu)
}

/// The 3-D (t, h, w) position of every token of `ids`, and the next free position. Each image
/// is `<|image_pad|>` repeated `t*h*w / merge²` times, preceded by `<|vision_start|>`; `grids`
/// lists the images in order. Text positions count up on all three axes.
pub fn rope_index(
    ids: &[u32],
    image_token: u32,
    grids: &[Grid],
    merge: usize,
    start: i64,
) -> Result<(Vec<[i64; 3]>, i64)> {
    const OP: &str = "rope_index";
    let mut pos = Vec::with_capacity(ids.len());
    let mut next = start;
    let mut images = grids.iter();
    let mut i = 0;
    while i < ids.len() {
        if ids[i] != image_token {
            pos.push([next; 3]);
            next += 1;
            i += 1;
            continue;
        }
        let Some(&[t, h, w]) = images.next() else {
            return Err(Error::Invalid {
                op: OP,
                detail: format!("more image token runs than the {} image grids given", grids.len()),
            });
        };
        let (gh, gw) = (h / merge, w / merge);
        let n = t * gh * gw;
        if ids.len() < i + n || ids[i..i + n].iter().any(|&x| x != image_token) {
            return Err(Error::Invalid {
                op: OP,
                detail: format!("image at token {i} needs {n} image tokens for grid {t}x{h}x{w} (merge {merge})"),
            });
        }
        pos.extend(image_positions([t, h, w], merge, next));
        next += image_span([t, h, w], merge);
        i += n;
    }
    if images.next().is_some() {
        return Err(Error::Invalid {
            op: OP,
            detail: format!("{} image grids but fewer image token runs", grids.len()),
        });
    }
    Ok((pos, next))
}

/// The 3-D positions of one image's merged tokens when it starts at `offset`. A still image has
/// no time: its temporal index is 0 (HF: `second_per_grid_t = 0` for images).
pub fn image_positions(grid: Grid, merge: usize, offset: i64) -> Vec<[i64; 3]> {
    let [t, h, w] = grid;
    let (gh, gw) = (h / merge, w / merge);
    let mut out = Vec::with_capacity(t * gh * gw);
    for _ in 0..t {
        for y in 0..gh {
            for x in 0..gw {
                out.push([offset, offset + y as i64, offset + x as i64]);
            }
        }
    }
    out
}

/// Positions an image occupies: the text after it starts this far after its offset
/// (its largest position + 1), which is not its token count.
pub fn image_span(grid: Grid, merge: usize) -> i64 {
    let [_, h, w] = grid;
    (h / merge).max(w / merge).max(1) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_every_token_once() {
        let (idx, cu) = window_index([1, 6, 8], 2, 2);
        let mut s = idx.clone();
        s.sort();
        assert_eq!(s, (0..12).collect::<Vec<_>>());
        assert_eq!(cu, vec![0, 16, 32, 40, 48]);
        assert_eq!(&idx[..4], &[0, 1, 4, 5]);
    }

    #[test]
    fn text_after_an_image_resumes_after_its_span() {
        let ids = [1, 9, 9, 9, 9, 9, 9, 2];
        let (pos, next) = rope_index(&ids, 9, &[[1, 4, 6]], 2, 0).unwrap();
        assert_eq!(pos[0], [0, 0, 0]);
        assert_eq!(pos[1], [1, 1, 1]);
        assert_eq!(pos[6], [1, 2, 3]);
        assert_eq!(pos[2], [1, 1, 2]);
        assert_eq!(pos[7], [4, 4, 4]);
        assert_eq!(next, 5);
        assert!(rope_index(&ids[..5], 9, &[[1, 4, 6]], 2, 0).is_err());
        assert!(rope_index(&ids, 9, &[], 2, 0).is_err());
    }
}

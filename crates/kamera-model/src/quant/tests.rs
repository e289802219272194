//! The repacking against candle's dequantizer (ggml's reference), and the products against
//! dense f32 arithmetic, for every block type on seeded random weights.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng, rngs::StdRng};

use super::table::with_table;
use super::{Linear, QMatrix, Table, dot, matmul, repack, rows, vnni};

const TYPES: [GgmlDType; 8] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

fn random(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    // Rows of different magnitudes and a few outliers, as in real weights.
    (0..rows * cols)
        .map(|i| {
            let row_scale = 0.02 * (1.0 + (i / cols % 7) as f32);
            let v: f32 = rng.random_range(-1.0..1.0);
            if rng.random_range(0..100) == 0 {
                8.0 * v * row_scale
            } else {
                v * row_scale
            }
        })
        .collect()
}

/// A `rows x cols` matrix quantized by candle (ggml's quantizer) to `dtype`: our repacking and
/// candle's own dequantization of the same blocks.
fn quantized(dtype: GgmlDType, rows: usize, cols: usize, seed: u64) -> (QMatrix, Vec<f32>) {
    let w = Tensor::from_vec(random(rows, cols, seed), (rows, cols), &Device::Cpu).unwrap();
    let qt = QTensor::quantize(&w, dtype).unwrap();
    let raw = qt.data().unwrap().to_vec();
    let reference = qt
        .dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let q = repack(dtype, &raw, rows, cols).unwrap_or_else(|| panic!("{dtype:?} not repacked"));
    (q, reference)
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn repacking_is_exact_for_every_block_type() {
    for (i, dtype) in TYPES.into_iter().enumerate() {
        let (q, reference) = quantized(dtype, 24, 512, i as u64);
        let ours = q.dequantize();
        let err = max_rel(&ours, &reference);
        // Exact up to one rounding of `scale · code + offset` against ggml's expression.
        assert!(
            err < 1e-6,
            "{dtype:?}: dequantized values differ by {err:e} of the largest"
        );
        assert_eq!(q.scales.len(), 24 * 512 / q.group, "{dtype:?}");
    }
}

#[test]
fn codes_are_no_larger_than_the_ggml_blocks_need() {
    for dtype in TYPES {
        let (q, _) = quantized(dtype, 8, 256, 3);
        let ggml = 8 * 256 / dtype.block_size() * dtype.type_size();
        let ratio = q.bytes() as f64 / ggml as f64;
        // The blocks with f16 scales (and offsets) take exactly their GGUF bytes: 4-bit codes
        // stay 4-bit, 5-bit 5-bit, the scales f16. The K-quants' scales are products, kept as
        // f32 (Q4_K 1.33x), and their 5- and 6-bit codes take a byte (Q6_K 1.52x, Q5_K 1.82x).
        let bound = match dtype {
            GgmlDType::Q4K => 1.34,
            GgmlDType::Q6K => 1.53,
            GgmlDType::Q5K => 1.82,
            _ => {
                assert!(
                    matches!(q.scales, Table::F16(_)),
                    "{dtype:?}: scales kept as the block's f16"
                );
                1.0
            }
        };
        assert!(
            ratio <= bound,
            "{dtype:?}: {} bytes vs {ggml} in GGUF ({ratio:.2}x)",
            q.bytes()
        );
    }
}

fn dense_matvec(w: &[f32], x: &[f32], rows: usize) -> Vec<f32> {
    let cols = x.len();
    (0..rows)
        .map(|r| {
            w[r * cols..(r + 1) * cols]
                .iter()
                .zip(x)
                .map(|(a, b)| (*a as f64) * (*b as f64))
                .sum::<f64>() as f32
        })
        .collect()
}

#[test]
fn matvec_matches_dense_products() {
    let mut rng = StdRng::seed_from_u64(7);
    // Enough rows to take the parallel path; an odd number of groups per row for the tails.
    for (i, dtype) in TYPES.into_iter().enumerate() {
        let (rows, cols) = if dtype.block_size() == 256 {
            (700, 768)
        } else {
            (700, 800)
        };
        let (q, w) = quantized(dtype, rows, cols, 10 + i as u64);
        let x: Vec<f32> = (0..cols).map(|_| rng.random_range(-2.0..2.0)).collect();
        let want = dense_matvec(&w, &x, rows);
        let mut got = vec![0f32; rows];
        dot::matvec(&q, &x, &mut got);
        let err = max_rel(&got, &want);
        assert!(err < 1e-5, "{dtype:?}: matvec differs by {err:e}");
        // The portable kernel (the fallback on CPUs without AVX-512) agrees too.
        let gpr = cols / q.group;
        for r in [0, rows / 2, rows - 1] {
            let codes = dot::row_codes(&q, r);
            // The code products alone (no group sums: no offsets' term), by the kernel this CPU runs.
            let mut simd = [0f32];
            dot::rows_into(&q, &x, None, &[], r, &mut simd);
            let simd = simd[0];
            let portable =
                with_table!(&q.scales, s => dot::portable(&q.codes, q.group, codes, &s[r * gpr..(r + 1) * gpr], &x));
            assert!(
                (simd - portable).abs() <= 1e-5 * portable.abs().max(1.0),
                "{dtype:?} row {r}: {simd} vs {portable}"
            );
        }
    }
}

#[test]
fn panel_gemm_matches_matvec_and_linear_picks_either() {
    let mut rng = StdRng::seed_from_u64(9);
    for dtype in [GgmlDType::Q4_1, GgmlDType::Q6K, GgmlDType::Q8_0] {
        // More rows than one panel holds, so the panel loop and its tail run.
        let (rows, cols) = (1100, 512);
        let (q, _) = quantized(dtype, rows, cols, 21);
        let max = rows::max_rows(&q);
        let n = max + 3;
        let x: Vec<f32> = (0..n * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut by_gemm = vec![0f32; n * rows];
        matmul::matmul(&q, &x, n, &mut by_gemm);
        let mut by_matvec = vec![0f32; n * rows];
        for (xr, yr) in x.chunks_exact(cols).zip(by_matvec.chunks_exact_mut(rows)) {
            dot::matvec(&q, xr, yr);
        }
        let err = max_rel(&by_gemm, &by_matvec);
        assert!(err < 1e-5, "{dtype:?}: panel GEMM vs matvec {err:e}");
        let lin = Linear::Quant(q);
        for m in [1, 2, max, n] {
            let xt = Tensor::from_slice(&x[..m * cols], (m, cols), &Device::Cpu).unwrap();
            let y = lin
                .forward(&xt)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let err = max_rel(&y, &by_matvec[..m * rows]);
            assert!(err < 1e-5, "{dtype:?}, {m} rows through Linear: {err:e}");
        }
        let bad = Tensor::zeros((2, cols + 32), candle_core::DType::F32, &Device::Cpu).unwrap();
        let e = lin.forward(&bad).unwrap_err().to_string();
        assert!(e.contains("columns"), "{e}");
    }
}

#[test]
fn row_block_product_matches_matvec_for_every_block_type_and_block_size() {
    let mut rng = StdRng::seed_from_u64(17);
    for (i, dtype) in TYPES.into_iter().enumerate() {
        // An odd number of weight rows: the last task ends on an unpaired row.
        let (r, cols) = (71, 512);
        let (q, _) = quantized(dtype, r, cols, 40 + i as u64);
        // 1..8 rows (every kernel width) and 19 (two full blocks and a tail).
        for n in [1, 2, 3, 4, 5, 6, 7, 8, 19] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut want = vec![0f32; n * r];
            for (xr, yr) in x.chunks_exact(cols).zip(want.chunks_exact_mut(r)) {
                dot::matvec(&q, xr, yr);
            }
            let mut got = vec![0f32; n * r];
            rows::product(&q, &x, n, &mut got);
            let err = max_rel(&got, &want);
            assert!(err < 1e-5, "{dtype:?}, {n} rows: row-block product vs matvec {err:e}");
            // The portable kernel (CPUs without AVX-512) agrees too.
            let mut acc = [0f32; rows::BLOCK];
            let nb = n.min(rows::BLOCK);
            rows::portable(&q, 3, &x[..nb * cols], nb, &mut acc);
            for (k, a) in acc[..nb].iter().enumerate() {
                let w = want[k * r + 3];
                assert!(
                    (a - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{dtype:?} portable row {k}: {a} vs {w}"
                );
            }
        }
    }
}

#[test]
fn unsupported_or_inconsistent_blocks_are_not_repacked() {
    let w = Tensor::from_vec(random(4, 256, 1), (4, 256), &Device::Cpu).unwrap();
    let qt = QTensor::quantize(&w, GgmlDType::Q2K).unwrap();
    let raw = qt.data().unwrap().to_vec();
    assert!(
        repack(GgmlDType::Q2K, &raw, 4, 256).is_none(),
        "Q2_K has no repacking: stays dense"
    );
    let qt = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
    let raw = qt.data().unwrap().to_vec();
    assert!(
        repack(GgmlDType::Q8_0, &raw[..raw.len() - 1], 4, 256).is_none(),
        "short data"
    );
    assert!(
        repack(GgmlDType::Q8_0, &raw, 4, 250).is_none(),
        "cols not a multiple of the block"
    );
}

/// Not a test: `cargo test --release -p kamera-model quant::tests::matvec_speed -- --ignored
/// --nocapture` prints the matrix-vector product's speed per block type (GB/s of codes read).
#[test]
#[ignore]
fn matvec_speed() {
    for dtype in [
        GgmlDType::Q4_1,
        GgmlDType::Q8_0,
        GgmlDType::Q5_0,
        GgmlDType::Q6K,
        GgmlDType::Q4K,
    ] {
        let (rows, cols) = (4864, 1024);
        let (q, _) = quantized(dtype, rows, cols, 1);
        let x: Vec<f32> = (0..cols).map(|i| (i as f32).sin()).collect();
        let mut y = vec![0f32; rows];
        let reps = 200;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            dot::matvec(&q, &x, &mut y);
        }
        let s = t.elapsed().as_secs_f64() / reps as f64;
        println!(
            "{dtype:?}: {:.3} ms per {rows}x{cols} matvec, {:.1} GB/s, {:.1} Gweights/s",
            s * 1e3,
            q.bytes() as f64 / s / 1e9,
            (rows * cols) as f64 / s / 1e9
        );
        let mut row = vec![0f32; cols];
        let t = std::time::Instant::now();
        for r in 0..rows {
            q.dequantize_row(r, &mut row);
        }
        let d = t.elapsed().as_secs_f64();
        for n in [8, 16, 32, 64, 128, 256, 512, 2048] {
            let xs: Vec<f32> = (0..n * cols).map(|i| (i as f32).cos()).collect();
            let mut ys = vec![0f32; n * rows];
            let t = std::time::Instant::now();
            matmul::matmul(&q, &xs, n, &mut ys);
            let g = t.elapsed().as_secs_f64();
            let t = std::time::Instant::now();
            rows::product(&q, &xs, n, &mut ys);
            let r = t.elapsed().as_secs_f64();
            let gf = |s: f64| 2.0 * (n * rows * cols) as f64 / s / 1e9;
            #[cfg(target_arch = "x86_64")]
            let b = if super::bf16::available() {
                let t = std::time::Instant::now();
                super::bf16::matmul(&q, &xs, n, &mut ys);
                format!(", bf16 tiles {:.1} GFLOP/s", gf(t.elapsed().as_secs_f64()))
            } else {
                String::new()
            };
            #[cfg(not(target_arch = "x86_64"))]
            let b = String::new();
            println!(
                "    {n} rows: panels {:.1} GFLOP/s, row blocks {:.1} GFLOP/s{b}",
                gf(g),
                gf(r)
            );
        }
        let n = 32;
        let xs: Vec<f32> = (0..n * cols).map(|i| (i as f32).cos()).collect();
        let mut ys = vec![0f32; n * rows];
        let t = std::time::Instant::now();
        matmul::matmul(&q, &xs, n, &mut ys);
        let g = t.elapsed().as_secs_f64();
        println!(
            "    dequantize (one thread) {:.2} ms ({:.2} Gweights/s); {n}-row product through panels {:.2} ms ({:.1} GFLOP/s)",
            d * 1e3,
            (rows * cols) as f64 / d / 1e9,
            g * 1e3,
            2.0 * (n * rows * cols) as f64 / g / 1e9
        );
    }
}

/// The bf16 kernel against f64 sums of the bf16-rounded operands: every tile shape (input rows
/// 1..=8 past a multiple of 8, a last weight tile of 4, 20 and 40 rows), every block type.
#[cfg(target_arch = "x86_64")]
#[test]
fn bf16_tiles_match_rounded_reference() {
    if !super::bf16::available() {
        kamera_ops::testkit::skip(
            "kamera-model quant::tests::bf16_tiles_match_rounded_reference",
            "this CPU has no AVX512_BF16",
        );
        return;
    }
    use super::bf16::round_bf16;
    for (t, dtype) in TYPES.into_iter().enumerate() {
        // K-quants need 256 columns a block; the others also get a partial last pass of pairs.
        let odd = if t >= 5 { 768 } else { 320 };
        for (rows, cols) in [(100, 256), (116, 512), (136, odd)] {
            let (q, w) = quantized(dtype, rows, cols, 40 + t as u64);
            for n in [1, 3, 8, 13, 21] {
                let x = random(n, cols, 7 + n as u64);
                let mut y = vec![f32::NAN; n * rows];
                super::bf16::matmul(&q, &x, n, &mut y);
                let reference: Vec<f32> = (0..n * rows)
                    .map(|i| {
                        let (m, r) = (i / rows, i % rows);
                        (0..cols)
                            .map(|c| round_bf16(x[m * cols + c]) as f64 * round_bf16(w[r * cols + c]) as f64)
                            .sum::<f64>() as f32
                    })
                    .collect();
                assert!(
                    y.iter().all(|v| v.is_finite()),
                    "{dtype:?} {rows}x{cols}, {n} rows: unwritten"
                );
                let e = max_rel(&y, &reference);
                assert!(e < 1e-5, "{dtype:?} {rows}x{cols}, {n} rows: max rel err {e}");
            }
        }
    }
    // The rounding itself: to nearest, ties to even, against the instruction.
    // The packed tiles against row-by-row dequantization (every row count of a last tile).
    for (t, dtype) in TYPES.into_iter().enumerate() {
        let cols = if t >= 5 { 256 } else { 96 };
        for rows in [1, 15, 16, 17, 47, 48, 100] {
            let (q, _) = quantized(dtype, rows, cols, 3 + rows as u64);
            for r0 in (0..rows).step_by(48) {
                let mut fast = vec![7u32; cols / 2 * 48];
                let mut slow = vec![7u32; cols / 2 * 48];
                super::bf16::pack_tile_for_test(&q, r0, &mut fast);
                super::bf16::pack_tile_reference(&q, r0, &mut slow);
                assert_eq!(fast, slow, "{dtype:?} {rows}x{cols}, tile at row {r0}");
            }
        }
    }
    // 1 + 2⁻⁸ is a tie (to 1), 1 + 3·2⁻⁸ one to the even 1 + 2⁻⁶.
    let ulp = 2f32.powi(-8);
    for v in [1.0f32, 1.0 + ulp, 1.0 + 3.0 * ulp, -3.3e-5, 65504.0, 1.0e-3] {
        let out = super::bf16::to_pairs(&[v, 0.0]);
        assert_eq!(f32::from_bits(out[0] << 16), round_bf16(v), "{v}");
    }
}

/// The int8 decode kernels (VNNI where the CPU has it, else AVX2; the AVX2 one and VNNI's
/// byte-step rows, which 5-bit codes take without VBMI, also called directly, so a VBMI host
/// checks all three) against their integer reference, for every block type,
/// with rows that end on half a 64-value step (9 groups of 32) where the block allows it.
#[test]
fn int8_decode_kernel_equals_its_reference_for_every_block_type() {
    if !vnni::available() {
        kamera_ops::testkit::skip(
            "quant::tests::int8_decode_kernel_equals_its_reference_for_every_block_type",
            "this CPU has neither AVX512-VNNI nor AVX2",
        );
        return;
    }
    // 9 groups of 32: a pair of 4-bit chunks and one group; 15: a pair, a chunk, three groups.
    let shapes = TYPES.iter().flat_map(|&d| {
        let cols: &[usize] = if d.block_size() == 32 { &[288, 480] } else { &[512] };
        cols.iter().map(move |&c| (d, c))
    });
    for (dtype, cols) in shapes {
        let (q, _) = quantized(dtype, 6, cols, 31);
        assert!(vnni::reads(&q), "{dtype:?}");
        let x = random(1, cols, 32);
        let x8 = vnni::Q8Input::quantize(&x).expect("whole blocks");
        // Rows 1..6: a block of four and one row alone (the AVX2 kernel's two paths), with
        // the offsets' term the kernels add.
        let sums = x8.group_sums(&q);
        let mut got = vec![0f32; q.rows - 1];
        vnni::code_rows(&q, 1, &x8, &sums, &mut got);
        #[cfg(target_arch = "x86_64")]
        let avx2 = super::avx2::available().then(|| {
            let mut out = vec![0f32; q.rows - 1];
            // SAFETY: the CPU has AVX2 + FMA; rows 1..6 of q; x8 has q.cols values.
            unsafe { super::avx2_int8::code_rows(&q, 1, &x8, &sums, &mut out) };
            out
        });
        #[cfg(not(target_arch = "x86_64"))]
        let avx2: Option<Vec<f32>> = None;
        // VNNI's byte-step rows, which 5-bit codes take on CPUs without VBMI.
        #[cfg(target_arch = "x86_64")]
        let steps = {
            let mut out = vec![0f32; q.rows - 1];
            vnni::code_rows_without_vbmi(&q, 1, &x8, &sums, &mut out).then_some(out)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let steps: Option<Vec<f32>> = None;
        for r in 1..q.rows {
            let (codes, offsets) = (vnni::reference(&q, r, &x8), dot::offset_dot(&q, r, &sums));
            let want = codes + offsets;
            // Relative to the two terms, which may cancel (Q4_K's offsets against its codes).
            let tol = 1e-5 * (codes.abs() + offsets.abs()).max(1e-3);
            let got = got[r - 1];
            assert!(
                (got - want).abs() <= tol,
                "{dtype:?} row {r}: kernel {got}, reference {want}"
            );
            for (name, got) in [("AVX2", &avx2), ("VNNI without VBMI", &steps)] {
                if let Some(got) = got {
                    let got = got[r - 1];
                    assert!(
                        (got - want).abs() <= tol,
                        "{dtype:?} row {r}: {name} kernel {got}, reference {want}"
                    );
                }
            }
        }
    }
}

/// The int8 input row is the same bits whichever loop made it (AVX-512 where the CPU has it,
/// the portable one elsewhere), in both roundings (blocks of 4 for byte codes, of 32 for 4-bit
/// codes): blocks with zeros, ties and the largest value negative.
#[test]
fn int8_input_is_the_same_bits_on_every_cpu() {
    let mut x = random(1, 896, 33);
    x[4..8].copy_from_slice(&[0.0; 4]);
    x[8..12].copy_from_slice(&[1.0, -0.5, 0.25, 127.0 / 254.0]);
    x[12..16].copy_from_slice(&[-3.0, 1.5, 0.0, 2.5]);
    x[64..96].copy_from_slice(&[0.0; 32]);
    let x8 = vnni::Q8Input::quantize(&x).expect("whole groups");
    for (block, dtype) in [(4, GgmlDType::Q8_0), (32, GgmlDType::Q4_0)] {
        let (m, _) = quantized(dtype, 1, 896, 1);
        let (mut q, mut dx, mut l) = (vec![0i8; 896], vec![0f32; 224], vec![0i32; 224]);
        vnni::quantize_portable(&x, block, &mut q, &mut dx, &mut l);
        for i in 0..896 {
            assert_eq!(
                x8.value(&m, i).to_bits(),
                (q[i] as f32 * dx[i / 4]).to_bits(),
                "blocks of {block}: value {i}"
            );
        }
        assert_eq!(x8.lanes128(&m), &l[..], "blocks of {block}: 128 · Σ q per lane");
        assert_eq!(x8.value(&m, 5), 0.0, "blocks of {block}: a zero");
        assert_eq!(x8.value(&m, 70), 0.0, "blocks of {block}: a block of zeros");
    }
}

/// A fill makes only the roundings asked for, and a kernel never reads one it did not make
/// (they read through pointers): 4- and 5-bit codes need the blocks of 32, bytes the blocks of 4.
#[test]
fn an_int8_input_holds_only_the_roundings_its_matrices_read() {
    let cols = 256;
    let (q4, _) = quantized(GgmlDType::Q4_0, 2, cols, 40);
    let (q5, _) = quantized(GgmlDType::Q5_0, 2, cols, 41);
    let (q8, _) = quantized(GgmlDType::Q8_0, 2, cols, 42);
    assert_eq!(vnni::Q8Input::needs([&q4, &q5]), (false, true));
    assert_eq!(vnni::Q8Input::needs([&q8]), (true, false));
    assert_eq!(vnni::Q8Input::needs([&q4, &q8]), (true, true));
    let x = random(1, cols, 43);
    let mut x8 = vnni::Q8Input::default();
    assert!(!x8.fill(&x[..48], true, true), "48 values are not whole groups of 32");
    assert!(x8.fill(&x, false, true));
    if !vnni::available() {
        kamera_ops::testkit::skip(
            "quant::tests::an_int8_input_holds_only_the_roundings_its_matrices_read",
            "this CPU has neither AVX512-VNNI nor AVX2 (the kernels' part)",
        );
        return;
    }
    // Whether a kernel refuses `x8` for `m` (a panic before it reads anything).
    let refuses = |m: &QMatrix, x8: &vnni::Q8Input| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            vnni::code_rows(m, 0, x8, &[], &mut [0f32; 2])
        }))
        .is_err()
    };
    assert!(!refuses(&q4, &x8), "4-bit codes read the blocks of 32");
    assert!(refuses(&q8, &x8), "byte codes refused an input without the blocks of 4");
    // A later fill of the other rounding drops the first.
    assert!(x8.fill(&x, true, false));
    assert!(!refuses(&q8, &x8), "byte codes read the blocks of 4");
    assert!(
        refuses(&q4, &x8),
        "4-bit codes refused an input without the blocks of 32"
    );
}

/// Int8 activations change a product by the input's rounding only: within 1% of the f32
/// product's largest value, for every block type; the quantized input within half a step.
#[test]
fn int8_decode_products_stay_within_the_inputs_rounding() {
    let cols = 512;
    let x = random(1, cols, 33);
    let x8 = vnni::Q8Input::quantize(&x).expect("whole blocks");
    for (block, dtype) in [(4, GgmlDType::Q8_0), (32, GgmlDType::Q4_0)] {
        let (m, _) = quantized(dtype, 1, cols, 1);
        for (b, xb) in x.chunks_exact(block).enumerate() {
            let dx = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for (i, &v) in xb.iter().enumerate() {
                let at = b * block + i;
                assert!(
                    (x8.value(&m, at) - v).abs() <= 0.5 * dx + 1e-9,
                    "blocks of {block}: value {at}"
                );
            }
        }
    }
    assert!(vnni::Q8Input::quantize(&x[..40]).is_none(), "not whole groups");
    if !vnni::available() {
        return;
    }
    for dtype in TYPES {
        let (q, _) = quantized(dtype, 64, cols, 34);
        let (mut exact, mut int8) = (vec![0f32; 64], vec![0f32; 64]);
        dot::rows_into(&q, &x, None, &dot::group_sums(&q, &x), 0, &mut exact);
        dot::rows_into_q8(&q, &x8, &x8.group_sums(&q), 0, &mut int8);
        let rel = max_rel(&int8, &exact);
        assert!(rel < 1e-2, "{dtype:?}: int8 products {rel} from f32");
    }
}

/// The AVX2 kernels (the path on x86 hosts without AVX-512) against the portable references,
/// called directly so that an AVX-512 host checks them too.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_kernels_equal_the_portable_ones_for_every_block_type() {
    if !super::avx2::available() {
        kamera_ops::testkit::skip(
            "quant::tests::avx2_kernels_equal_the_portable_ones_for_every_block_type",
            "the CPU has no AVX2 + FMA",
        );
        return;
    }
    let close = |a: f32, b: f32| (a - b).abs() <= 1e-5 * b.abs().max(1.0);
    let mut rng = StdRng::seed_from_u64(23);
    for (i, dtype) in TYPES.into_iter().enumerate() {
        // Three rows of groups per row odd and even (tails of the two-accumulator loop).
        let cols = if dtype.block_size() == 256 { 768 } else { 800 };
        let (q, _) = quantized(dtype, 9, cols, 60 + i as u64);
        let gpr = cols / q.group;
        let x: Vec<f32> = (0..rows::BLOCK * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
        // Decode's rows 1..8, and (groups of 32) the same on the input in lane order, with the
        // offsets' term the kernel adds (a group's sum is the same in lane order).
        let sums = dot::group_sums(&q, &x[..cols]);
        let mut dots = [0f32; 7];
        // SAFETY: the CPU has AVX2 and FMA (checked above); rows 1..8 of q, x has q.cols values.
        unsafe { super::avx2::code_rows(&q, 1, &x[..cols], false, &sums, &mut dots) };
        let mut lanes = [0f32; 7];
        if q.group == 32 {
            let xl = super::avx2::lane_order(&x[..cols]);
            // SAFETY: as above; groups of 32, xl has q.cols values in lane order.
            unsafe { super::avx2::code_rows(&q, 1, &xl, true, &sums, &mut lanes) };
        }
        for (r, (&simd, &lane)) in (1..8).zip(dots.iter().zip(&lanes)) {
            let codes = dot::row_codes(&q, r);
            let want = with_table!(&q.scales, s => dot::portable(&q.codes, q.group, codes, &s[r * gpr..(r + 1) * gpr], &x[..cols]))
                + dot::offset_dot(&q, r, &sums);
            assert!(close(simd, want), "{dtype:?} row {r} dot: {simd} vs {want}");
            assert!(
                q.group != 32 || close(lane, want),
                "{dtype:?} row {r} lane-order dot: {lane} vs {want}"
            );
        }
        for r in [0, 4, 8] {
            for nb in 1..=rows::BLOCK {
                let (mut got, mut want) = ([0f32; rows::BLOCK], [0f32; rows::BLOCK]);
                // SAFETY: as above; `x` holds `nb ≤ BLOCK` rows of `cols`.
                unsafe { super::avx2::row_block(&q, r, &x[..nb * cols], nb, &mut got) };
                rows::portable(&q, r, &x[..nb * cols], nb, &mut want);
                for k in 0..nb {
                    assert!(
                        close(got[k], want[k]),
                        "{dtype:?} row {r}, {nb} rows, row {k}: {} vs {}",
                        got[k],
                        want[k]
                    );
                }
            }
            for nb in 1..=super::avx2::PAIR_ROWS {
                // SAFETY: as above; rows r and 8 - r exist.
                let got = unsafe { super::avx2::pair_block(&q, r, 8 - r, &x[..nb * cols], nb) };
                for (w, row) in [(0, r), (1, 8 - r)] {
                    let mut want = [0f32; rows::BLOCK];
                    rows::portable(&q, row, &x[..nb * cols], nb, &mut want);
                    for k in 0..nb {
                        assert!(
                            close(got[w][k], want[k]),
                            "{dtype:?} pair row {row}, {nb} rows, row {k}: {} vs {}",
                            got[w][k],
                            want[k]
                        );
                    }
                }
            }
            let (mut got, mut want) = (vec![0f32; cols], vec![0f32; cols]);
            // SAFETY: as above; `got` holds one row.
            unsafe { super::avx2::dequantize_row(&q, r, &mut got) };
            q.dequantize_row_portable(r, &mut want);
            for (c, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(close(*a, *b), "{dtype:?} row {r} col {c} dequantized: {a} vs {b}");
            }
        }
    }
}

/// Not a test: `cargo test --release -p kamera-model quant::tests::decode_rows_speed -- --ignored
/// --nocapture` prints decode's products on one thread (f32 and int8 input, G weights/s and GB/s
/// of codes and scales read), each block type at a row width of the Qwen2.5/SmolLM2 models,
/// on a matrix too large for the cache (65,536 rows), as a decode step streams its weights.
#[test]
#[ignore = "a speed probe, not a test"]
fn decode_rows_speed() {
    for dtype in [
        GgmlDType::Q5_0,
        GgmlDType::Q4K,
        GgmlDType::Q6K,
        GgmlDType::Q8_0,
        GgmlDType::Q4_1,
        GgmlDType::Q4_0,
    ] {
        let cols = if dtype.block_size() == 256 { 1024 } else { 896 };
        let rows = 65_536;
        let (q, _) = quantized(dtype, rows, cols, 1);
        let x: Vec<f32> = (0..cols).map(|i| (i as f32).sin()).collect();
        let mut y = vec![0f32; rows];
        let xsum = dot::group_sums(&q, &x);
        let x8 = vnni::Q8Input::quantize(&x).expect("whole groups");
        let xs8 = x8.group_sums(&q);
        let best = |f: &mut dyn FnMut()| {
            (0..5)
                .map(|_| {
                    let t = std::time::Instant::now();
                    f();
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::MAX, f64::min)
        };
        let xl = dot::lane_input(&q, &x);
        let f32_s = best(&mut || dot::rows_into(&q, &x, xl.as_deref(), &xsum, 0, &mut y));
        let int8_s = vnni::available().then(|| best(&mut || dot::rows_into_q8(&q, &x8, &xs8, 0, &mut y)));
        // The AVX2 int8 kernel called directly (the one AVX2-only hosts run).
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX2, FMA and F16C; all rows of q; x8 has q.cols values.
        let avx2_s = super::avx2::available()
            .then(|| best(&mut || unsafe { super::avx2_int8::code_rows(&q, 0, &x8, &xs8, &mut y) }));
        #[cfg(not(target_arch = "x86_64"))]
        let avx2_s: Option<f64> = None;
        let w = (rows * cols) as f64;
        let rate = |s: f64| format!("{:.1} G weights/s, {:.1} GB/s", w / s / 1e9, q.bytes() as f64 / s / 1e9);
        println!(
            "{dtype:?} {rows}x{cols}: f32 {}; int8 {}; AVX2 int8 {}",
            rate(f32_s),
            int8_s.map_or("not on this CPU".into(), rate),
            avx2_s.map_or("not on this CPU".into(), rate)
        );
    }
}

#[test]
fn a_bf16_checkpoints_matrices_are_held_in_bf16_at_either_precision() {
    use super::PrefillPrecision;
    // Whole padding blocks (rows a multiple of 32, pairs of 16), so the bytes are exactly half.
    let (rows, cols) = (64, 64);
    let exact: Vec<f32> = random(rows, cols, 3)
        .iter()
        .map(|v| f32::from_bits(v.to_bits() & 0xffff_0000))
        .collect();
    let t = |w: &[f32]| Tensor::from_slice(w, (rows, cols), &Device::Cpu).unwrap();
    let mut lin = Linear::dense(t(&exact), PrefillPrecision::F32).unwrap();
    assert!(matches!(lin, Linear::Bf16(_)), "bf16 values are held in bf16");
    assert_eq!(lin.precision(), PrefillPrecision::F32, "and multiplied in f32");
    assert_eq!(lin.bytes(), rows * cols * 2, "half the bytes of f32");
    assert_eq!(lin.to_f32().unwrap(), exact, "without rounding");
    let x = Tensor::from_vec(random(5, cols, 4), (5, cols), &Device::Cpu).unwrap();
    let want = x
        .matmul(&t(&exact).t().unwrap())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert!(
        max_rel(&lin.forward_vec(&x).unwrap(), &want) < 1e-6,
        "the f32 matrix's products"
    );
    // Decode's view of it (one row, the input's lane order prepared once).
    let x0 = &random(1, cols, 4);
    let mut one = vec![0f32; rows];
    Linear::with_views(&[&lin], |v| {
        let prep = v[0].prepare(x0, None);
        v[0].rows_into(x0, &prep, 0, &mut one[..rows / 2]);
        v[0].rows_into(x0, &prep, rows / 2, &mut one[rows / 2..]);
    })
    .unwrap();
    assert!(max_rel(&one, &want[..rows]) < 1e-6, "decode's one-row products");
    // On the tiles and back, where the CPU has them: the values stay.
    let took = lin.set_precision(PrefillPrecision::Bf16, true).unwrap();
    assert_eq!(took, PrefillPrecision::Bf16.available());
    assert!(lin.set_precision(PrefillPrecision::F32, true).unwrap());
    assert_eq!(lin.precision(), PrefillPrecision::F32);
    assert_eq!(lin.to_f32().unwrap(), exact);
    // Values that are not bf16 stay f32 (rounding them would change the model).
    let f32_lin = Linear::dense(t(&random(rows, cols, 3)), PrefillPrecision::F32).unwrap();
    assert!(matches!(f32_lin, Linear::Dense(_)));
}

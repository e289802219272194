//! The store the runtime opens decodes the patches coded in the model's basis: `open_store` gives
//! the stack the bases it is passed (`open_runtime` passes the model's), and a stack opened
//! without that basis refuses such a record by name instead of serving it.

use std::sync::Arc;

use anyhow::Result;
use kamera_agent::{StoreSource, open_store};
use kamera_ops::{Bases, BasisCoding, Buf, Deficit, KvLayout, Mat, PatchBasis, RankPolicy, transform_patch};
use kamera_store::{ChunkId, Error, Key, ModelFp, Record};

/// A deterministic `rows x cols` matrix of values in (-1, 1).
fn mat(rows: usize, cols: usize, seed: u64) -> Mat {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v = (0..rows * cols)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
        })
        .collect();
    Mat::new(rows, cols, Buf::F32(v)).expect("a matrix")
}

#[test]
fn the_stack_decodes_coded_patches_in_the_bases_it_is_given() -> Result<()> {
    let layout = KvLayout::gqa(2, 4, 2, 4);
    let f = layout.k_features();
    let eye: Vec<f32> = (0..f * f).map(|i| if i % (f + 1) == 0 { 1.0 } else { 0.0 }).collect();
    let layers = (0..layout.n_layers).map(|_| (eye.clone(), eye.clone())).collect();
    let basis = Arc::new(PatchBasis::new(f, f, layers, None)?);
    let n = 12;
    let d = Deficit {
        layers: (0..layout.n_layers as u64)
            .map(|l| (mat(n, f, 2 * l + 1), mat(n, f, 2 * l + 2)))
            .collect(),
    };
    let coding = BasisCoding {
        basis: basis.clone(),
        entropy: true,
    };
    let kv_bytes = n * layout.n_layers * 2 * f * 2;
    let patch = transform_patch(&d, &layout, kv_bytes, &RankPolicy::Budget { fraction: 0.5 }, &coding)?;
    assert!(patch.code().is_some());
    let m = ModelFp::of("store-bases-test");
    let id = ChunkId::of(b"page", "enc", m);
    let key = Key::patch(m, id, &[(ChunkId::of(b"before", "enc", m), 0)], 7);
    let rec = Record::patch(m, 5, patch);

    let dir = tempfile::tempdir()?;
    let stack = |bases: &Bases| {
        open_store(
            &StoreSource::Stack {
                dir: Some(dir.path().to_path_buf()),
                redis: None,
                write_behind: None,
                tls_ca: None,
            },
            bases,
        )
    };
    let model_basis = Bases::from(basis);
    {
        let s = stack(&model_basis)?;
        s.put(&key, rec.clone())?;
        s.flush()?;
    }
    // A fresh stack: its memory tier is empty, so the disk store decodes the record.
    {
        let s = stack(&model_basis)?;
        assert_eq!(*s.get(&key)?.expect("stored on disk"), rec);
    }
    let s = stack(&Bases::new())?;
    let e = s.get(&key).unwrap_err();
    assert!(matches!(e, Error::MissingBasis { .. }), "{e}");
    Ok(())
}

//! The `uploads` folder of a scenario: the files its `upload` steps may send, checked when the
//! scenario is parsed (lexically: no absolute path, no `..` out) and when a step runs (on disk:
//! links followed, the real path inside the folder's).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// `file` (relative to `dir`) written so that it stays inside `dir`: not absolute, no `..`
/// that climbs out. Symbolic links are for [`upload_file`] to refuse.
pub(super) fn lexically_inside(dir: &Path, file: &str) -> std::result::Result<(), String> {
    use std::path::Component;
    let mut depth = 0usize;
    for c in Path::new(file).components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir if depth > 0 => depth -= 1,
            _ => {
                return Err(format!(
                    "upload path {file:?} is outside the uploads folder {} (paths are relative to it and stay inside)",
                    dir.display()
                ));
            }
        }
    }
    if depth == 0 {
        return Err(format!("upload path {file:?} names no file in {}", dir.display()));
    }
    Ok(())
}

/// The file an `upload` step (1-based `step`) of `path` takes from the folder `uploads`, checked
/// on disk: the folder exists, the file exists and is a regular file, and its real path (links
/// followed) lies inside the folder's. An error names the step, the path and the folder.
pub fn upload_file(uploads: Option<&Path>, step: usize, path: &str) -> Result<PathBuf> {
    let bad = |detail: String| Error::Step { step, detail };
    let Some(dir) = uploads else {
        return Err(bad(format!(
            "upload {path:?}: no folder allows uploads (the scenario's `uploads`)"
        )));
    };
    lexically_inside(dir, path).map_err(bad)?;
    let root = std::fs::canonicalize(dir)
        .map_err(|e| bad(format!("the uploads folder {} cannot be read: {e}", dir.display())))?;
    let file = std::fs::canonicalize(dir.join(path))
        .map_err(|e| bad(format!("upload {path:?}: no such file in {}: {e}", dir.display())))?;
    if !file.starts_with(&root) {
        return Err(bad(format!(
            "upload {path:?} leads outside the uploads folder {} (to {}): refused",
            dir.display(),
            file.display()
        )));
    }
    if !file.is_file() {
        return Err(bad(format!(
            "upload {path:?} in {} is not a regular file",
            dir.display()
        )));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{Scenario, ScriptStep};

    fn scenario(dir: &Path, uploads: &str, file: &str) -> Result<Scenario> {
        let text = format!(
            "name = \"u\"\ngoal = \"g\"\n{uploads}\n[site]\nseed = 1\n[[steps]]\nupload = \"#f\"\npath = {file:?}\n"
        );
        Scenario::parse(&text, &dir.join("s.toml"))
    }

    /// An upload step's file must lie in the folder the scenario allows: none declared, an
    /// absolute path, `..` out of it, and a symbolic link out of it are refused, each naming the
    /// step and the folder; a file inside is taken.
    #[test]
    fn upload_paths_stay_in_the_allowed_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("scenarios");
        std::fs::create_dir_all(dir.join("files/sub")).unwrap();
        std::fs::write(dir.join("files/sub/a.txt"), b"a").unwrap();
        std::fs::write(tmp.path().join("secret.txt"), b"s").unwrap();

        let e = scenario(&dir, "", "a.txt").unwrap_err().to_string();
        assert!(e.contains("step 1") && e.contains("uploads = "), "{e}");
        let e = scenario(&dir, "uploads = \"files\"", "../../secret.txt")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("step 1") && e.contains("outside") && e.contains("files"),
            "{e}"
        );
        let abs = tmp.path().join("secret.txt").display().to_string();
        let e = scenario(&dir, "uploads = \"files\"", &abs).unwrap_err().to_string();
        assert!(e.contains("outside"), "{e}");
        let e = scenario(&dir, "uploads = \"files\"", "sub/..").unwrap_err().to_string();
        assert!(e.contains("names no file"), "{e}");

        let s = scenario(&dir, "uploads = \"files\"", "sub/../sub/a.txt").unwrap();
        let root = s.uploads.clone().unwrap();
        assert!(root.is_absolute() && root.ends_with("scenarios/files"), "{root:?}");
        // Serialized and parsed again (a trace header), the folder stays the same.
        assert_eq!(Scenario::parse(&s.to_toml(), &dir.join("s.toml")).unwrap(), s);
        let ScriptStep::Upload { path, .. } = &s.steps[0] else {
            panic!("{:?}", s.steps)
        };
        let got = upload_file(s.uploads.as_deref(), 1, path).unwrap();
        assert_eq!(got, std::fs::canonicalize(dir.join("files/sub/a.txt")).unwrap());

        // On disk: a link out of the folder, a missing file, a folder, no folder at all.
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(tmp.path().join("secret.txt"), dir.join("files/link.txt")).unwrap();
            let e = upload_file(Some(&root), 3, "link.txt").unwrap_err().to_string();
            assert!(
                e.contains("step 3") && e.contains("outside") && e.contains("refused"),
                "{e}"
            );
        }
        let e = upload_file(Some(&root), 2, "nope.txt").unwrap_err().to_string();
        assert!(
            e.contains("step 2") && e.contains("no such file") && e.contains("nope.txt"),
            "{e}"
        );
        let e = upload_file(Some(&root), 2, "sub").unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let e = upload_file(None, 4, "a.txt").unwrap_err().to_string();
        assert!(e.contains("step 4") && e.contains("no folder"), "{e}");
    }
}

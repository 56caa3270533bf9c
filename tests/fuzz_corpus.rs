//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) and the test fixtures through
//! the same property checks the cargo-fuzz targets run. CI runs this; fuzzing itself runs
//! locally (`cargo +nightly fuzz run <target>`, see DEVELOPERS.md, "Fuzzing").

#[path = "../fuzz/checks.rs"]
mod checks;

use std::path::{Path, PathBuf};

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

fn replay(target: &str, check: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut inputs = files(&root.join("fuzz/corpus").join(target));
    if target == "decode" {
        inputs.extend(files(&root.join("tests/fixtures")));
    }
    assert!(!inputs.is_empty(), "the {target} corpus is empty");
    for input in &inputs {
        let data = std::fs::read(input).unwrap();
        if let Err(panic) = std::panic::catch_unwind(|| check(&data)) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{target}: {} fails: {message}", input.display());
        }
    }
    inputs.len()
}

#[test]
fn decode_corpus() {
    assert!(replay("decode", checks::check_decode) >= 8);
}

#[test]
fn ip_spec_corpus() {
    assert!(replay("ip_spec", checks::check_ip_spec) >= 10);
}

#[test]
fn annotations_corpus() {
    assert!(replay("annotations", checks::check_annotations) >= 8);
}

#[test]
fn patch_corpus() {
    assert!(replay("patch", checks::check_patch) >= 3);
}

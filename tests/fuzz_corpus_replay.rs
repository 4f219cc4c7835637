//! Replays the saved cargo-fuzz corpus (`fuzz/corpus/<target>/`) through the same checks the
//! fuzz targets run (`campaign::config::fuzzing`), so CI covers them without cargo-fuzz.

use std::path::PathBuf;

use puzzletron::campaign::config::fuzzing;

fn replay(target: &str, check: fn(&[u8])) -> usize {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    for f in &files {
        let data = std::fs::read(f).unwrap();
        let r = std::panic::catch_unwind(|| check(&data));
        assert!(r.is_ok(), "{} failed on {}", target, f.display());
    }
    files.len()
}

#[test]
fn override_parser_corpus() {
    assert!(replay("override_parser", fuzzing::override_parser) >= 10);
}

#[test]
fn interpolation_corpus() {
    assert!(replay("interpolation", fuzzing::interpolation) >= 10);
}

#[test]
fn yaml_overrides_corpus() {
    assert!(replay("yaml_overrides", fuzzing::yaml_overrides) >= 5);
}

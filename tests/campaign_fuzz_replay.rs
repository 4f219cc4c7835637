//! Replays the saved cargo-fuzz corpus of the `compile` target (`fuzz/corpus/compile/`, the
//! minimized corpus of the fuzzing runs) and the hand-written seeds (`fuzz/seeds/compile/`)
//! through the same checks the target runs, so CI covers them without cargo-fuzz.

use std::path::PathBuf;

fn replay(dir: &str) -> usize {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    for f in &files {
        // A running fuzzer may replace files while we read; skip those that vanished.
        let Ok(data) = std::fs::read(f) else { continue };
        let r = std::panic::catch_unwind(|| puzzletron::campaign::fuzzing::compile(&data));
        assert!(r.is_ok(), "compile target failed on {}", f.display());
    }
    files.len()
}

#[test]
fn compile_corpus() {
    let n = replay("fuzz/corpus/compile");
    assert!(n >= 1000, "corpus has {n} files");
}

#[test]
fn compile_seeds() {
    assert_eq!(replay("fuzz/seeds/compile"), 13);
}

/// The corpus exercises successful plans and refusals, not only early exits.
#[test]
fn corpus_seeds_compile_or_are_refused_as_expected() {
    use puzzletron::campaign::fuzzing::{CompileOutcome, compile};
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/compile");
    let run = |name: &str| compile(&std::fs::read(dir.join(name)).unwrap());
    assert_eq!(run("user_chain"), CompileOutcome::Compiled(3));
    assert_eq!(run("user_overrides"), CompileOutcome::Compiled(1));
    // convert, width_importance, sort, build_library, replacement_scoring, mip.
    assert_eq!(run("puzzle_min"), CompileOutcome::Compiled(6));
    // 6 core + tokenize_data + vllm_stats + 5 post nodes (zero_shot is replaced by the flow).
    assert_eq!(run("puzzle_flows"), CompileOutcome::Compiled(13));
    assert_eq!(run("baremetal"), CompileOutcome::Compiled(1));
    assert_eq!(run("interp"), CompileOutcome::Compiled(1));
    // interactive_max_nodes: 2 but bypass (pp4 x ep4 x dp_shard4 = 16 GPUs) needs 2 nodes: fine;
    // max_nodes: 4 and replacement_scoring 5 pool workers of 1 GPU: 1 node. Compiles.
    assert_eq!(run("puzzle_exec"), CompileOutcome::Compiled(8));
    // 5 instances of tp=3 need 3 nodes (2 per 8-GPU node); 2 hosts are too few.
    for refused in [
        "user_cycle",
        "user_missing",
        "bad_mesh",
        "bad_mesh_float",
        "baremetal_too_small",
        "puzzle_flows_pool_short",
    ] {
        assert_eq!(run(refused), CompileOutcome::Refused, "{refused}");
    }
}

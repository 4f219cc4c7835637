//! Fuzzes campaign compilation: experiment YAML + overrides (+ runner/execution sections) ->
//! `compile_resolved`, with the invariants of `puzzletron::campaign::fuzzing::compile`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = puzzletron::campaign::fuzzing::compile(data);
});

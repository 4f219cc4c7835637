//! Fuzzes YAML loading + overrides + interpolation of one document.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    puzzletron::campaign::config::fuzzing::yaml_overrides(data);
});

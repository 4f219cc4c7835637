//! Fuzzes the Hydra override parser and applying a parsed override to a small config.
//! The checks live in `puzzletron::campaign::config::fuzzing` so the corpus replay test runs
//! exactly the same code.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    puzzletron::campaign::config::fuzzing::override_parser(data);
});

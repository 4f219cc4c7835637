//! Fuzzes the `${...}` interpolation parser and resolver (cycles, nesting, resolvers).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    puzzletron::campaign::config::fuzzing::interpolation(data);
});

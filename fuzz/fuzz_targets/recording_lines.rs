#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| den_fuzzing::recording_lines(data));

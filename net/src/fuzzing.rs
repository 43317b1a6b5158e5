//! Fuzzing on stable Rust, with proptest as the engine: each target (a `fuzz_*` test next to
//! the code it drives) gets inputs that are seeds from `net/fuzz/<target>/` with a few random
//! mutations (bytes flipped, inserted, deleted, spliced; tokens that broke parsers before, such
//! as `ffffffffffffffff` or a bare `\n`), or plain random bytes. A target asserts that its
//! code never panics and that what it accepts stays within its limits.
//!
//! `cargo test` runs [`CASES_DEFAULT`] inputs per target (CI does); a longer run is
//! `PICO_FUZZ_CASES=1000000 cargo test --release -p pico-net fuzz_` (docs/security.md).

use proptest::prelude::*;

/// Inputs per target in an ordinary test run.
pub const CASES_DEFAULT: u32 = 2_000;

/// Inputs per target: `$PICO_FUZZ_CASES`, else [`CASES_DEFAULT`].
pub fn cases() -> u32 {
    std::env::var("PICO_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES_DEFAULT)
}

/// Byte strings worth splicing in: sizes and numbers at the edges, line endings, JSON and URL
/// punctuation.
const TOKENS: &[&[u8]] = &[
    b"ffffffffffffffff",
    b"18446744073709551615",
    b"18446744073709551616",
    b"9223372036854775808",
    b"-1",
    b"+1",
    b"0x",
    b"\r\n",
    b"\n",
    b"\r",
    b"\r\n\r\n",
    b"\0",
    b"%",
    b"%zz",
    b"%00",
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b"\\u0000",
    b"null",
    b":",
    b";",
    b",",
    b"_",
    b"/",
    b"//",
    b"..",
    b"*",
    b"\xff\xfe",
];

/// The seed files of `target` (at least one input: the empty one).
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(target);
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("seed corpus {}: {e}", dir.display()))
        .filter_map(|entry| std::fs::read(entry.ok()?.path()).ok())
        .collect();
    seeds.sort();
    seeds.push(Vec::new());
    seeds
}

#[derive(Clone, Debug)]
enum Mutation {
    Overwrite(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Token(usize, usize),
    Duplicate(usize, usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        (at, any::<u8>()).prop_map(|(i, b)| Mutation::Overwrite(i, b)),
        (at, any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        at.prop_map(Mutation::Delete),
        (at, 0..TOKENS.len()).prop_map(|(i, t)| Mutation::Token(i, t)),
        (at, 1usize..64).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
        at.prop_map(Mutation::Truncate),
    ]
}

fn apply(mut input: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for mutation in mutations {
        let position = |i: usize, len: usize| if len == 0 { 0 } else { i % (len + 1) };
        match *mutation {
            Mutation::Overwrite(i, b) if !input.is_empty() => {
                let at = i % input.len();
                input[at] = b;
            }
            Mutation::Overwrite(..) => {}
            Mutation::Insert(i, b) => {
                let at = position(i, input.len());
                input.insert(at, b);
            }
            Mutation::Delete(i) if !input.is_empty() => {
                let at = i % input.len();
                input.remove(at);
            }
            Mutation::Delete(_) => {}
            Mutation::Token(i, t) => {
                let at = position(i, input.len());
                input.splice(at..at, TOKENS[t].iter().copied());
            }
            Mutation::Duplicate(i, n) => {
                let at = position(i, input.len());
                let end = (at + n).min(input.len());
                let copy = input[at..end].to_vec();
                input.splice(at..at, copy);
            }
            Mutation::Truncate(i) => {
                let at = position(i, input.len());
                input.truncate(at);
            }
        }
    }
    input
}

/// Inputs for `target`: mostly mutated seeds, some random bytes.
pub fn inputs(target: &str) -> impl Strategy<Value = Vec<u8>> {
    let seeds = seeds(target);
    let mutated = (0..seeds.len(), proptest::collection::vec(mutation(), 0..8))
        .prop_map(move |(seed, mutations)| apply(seeds[seed].clone(), &mutations));
    prop_oneof![
        8 => mutated,
        1 => proptest::collection::vec(any::<u8>(), 0..256),
    ]
}

/// The proptest settings of a target: [`cases`] inputs, no failure files (a failure prints
/// its minimal input, which belongs in the target's seed corpus once fixed).
pub fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

//! `eprintln!` for this crate, in place of std's, which panics when stderr is gone
//! (`pico bench 2>&1 | head`). Declared `#[macro_use]` before every other module, it shadows
//! std's everywhere in the crate; a closed stderr is ignored, as there is nowhere left to
//! report anything, and the run goes on.

use std::fmt;
use std::io::{self, Write};

macro_rules! eprintln {
    ($($arg:tt)*) => {
        $crate::output::stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Writes to stderr, ignoring failure.
pub(crate) fn stderr(args: fmt::Arguments) {
    let _ = io::stderr().lock().write_fmt(args);
}

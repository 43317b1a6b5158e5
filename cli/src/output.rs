//! `println!`, `eprint!` and `eprintln!` for this crate, in place of std's, which
//! panic when their output is gone (`pico serve --help | head` closes the pipe early). Declared
//! `#[macro_use]` before every other module, they shadow std's everywhere in the crate, so no
//! output of the CLI can panic: a stdout closed by its reader ends the process quietly with
//! status 0, like a command's `Failure::BrokenPipe`; a closed stderr is ignored, as there is
//! nowhere left to report anything.

use std::fmt;
use std::io::{self, Write};

macro_rules! println {
    () => {
        $crate::output::stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

macro_rules! eprint {
    ($($arg:tt)*) => {
        $crate::output::stderr(format_args!($($arg)*))
    };
}

macro_rules! eprintln {
    () => {
        $crate::output::stderr(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Writes to stdout; if that fails the process ends (quietly when the reader is gone).
pub fn stdout(args: fmt::Arguments) {
    let written = io::stdout().lock().write_fmt(args);
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            stderr(format_args!("pico: cannot write to stdout: {e}\n"));
            std::process::exit(1)
        }
    }
}

/// Writes to stderr, ignoring failure.
pub fn stderr(args: fmt::Arguments) {
    let _ = io::stderr().lock().write_fmt(args);
}

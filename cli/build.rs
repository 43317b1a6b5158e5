//! Records the commit `pico` is built from, for `pico --version`, the start-up log, `/metrics`
//! (`pico_build_info`), the admin API and the dashboard: `git rev-parse --short HEAD` when the
//! source is a git checkout with git installed, else `unknown` (a source tarball).
//!
//! Release builds also link `pico` with `hot-code.ld`, which places the functions a node runs
//! ahead of the rest of its code (`hot_code_layout`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
        (out.status.success() && !text.is_empty()).then_some(text)
    };
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PICO_GIT_COMMIT={commit}");
    // Built again when HEAD moves (a checkout, or a commit: the reflog grows).
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        for file in ["HEAD", "logs/HEAD"] {
            let path = std::path::Path::new(&dir).join(file);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
    hot_code_layout();
}

/// Passes `hot-code.ld` (written by `scripts/hot-code.sh`) to the linker of release builds of
/// `pico`: the functions a node runs sit next to each other at the start of its code instead
/// of among the 10 MB that only other commands, errors and configurations use, so the pages
/// the kernel maps around each one it runs hold mostly code that runs too. An idle node maps
/// megabytes less of the executable (docs/decisions/2026-12-hot-code-layout.md); nothing else
/// changes. The script's `INSERT BEFORE .text` form is understood by lld (Rust's default linker
/// on x86-64 Linux) and GNU ld; with any other linker, or a target that is not ELF, the build
/// goes on without it: a trial link of an empty program decides.
fn hot_code_layout() {
    println!("cargo:rerun-if-changed=hot-code.ld");
    let script = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default())
        .join("hot-code.ld");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    if !release || !script.exists() {
        return;
    }
    let link_arg = format!("-Wl,-T,{}", script.display());
    if links_with(&link_arg) {
        println!("cargo:rustc-link-arg-bin=pico={link_arg}");
    } else {
        println!("cargo:warning=the linker does not take hot-code.ld: pico is linked without it");
    }
}

/// Whether an empty program links for this build's target, with this build's compiler, flags
/// and linker, and `link_arg` added.
fn links_with(link_arg: &str) -> bool {
    let Some(out_dir) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return false;
    };
    let source = out_dir.join("hot_code_probe.rs");
    if std::fs::write(&source, "fn main() {}\n").is_err() {
        return false;
    }
    let mut rustc = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()));
    rustc
        .args(["--crate-type=bin", "--crate-name=hot_code_probe", "-o"])
        .arg(out_dir.join("hot_code_probe"))
        .arg(&source)
        .arg(format!("-Clink-arg={link_arg}"));
    if let Ok(target) = std::env::var("TARGET") {
        rustc.args(["--target", &target]);
    }
    if let Ok(linker) = std::env::var("RUSTC_LINKER") {
        rustc.arg(format!("-Clinker={linker}"));
    }
    // The flags cargo passes to every compilation (RUSTFLAGS, `build.rustflags`): a linker
    // chosen there is the one to ask.
    if let Ok(flags) = std::env::var("CARGO_ENCODED_RUSTFLAGS") {
        rustc.args(flags.split('\x1f').filter(|f| !f.is_empty()));
    }
    rustc
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

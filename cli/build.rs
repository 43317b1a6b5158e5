//! Records the commit `pico` is built from, for `pico --version`, the start-up log, `/metrics`
//! (`pico_build_info`), the admin API and the dashboard: `git rev-parse --short HEAD` when the
//! source is a git checkout with git installed, else `unknown` (a source tarball).

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
}

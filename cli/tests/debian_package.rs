//! The Debian package and its systemd unit on a real Debian system: `scripts/deb-check.sh`
//! packages this test's `pico` (`scripts/build-deb.sh`), boots a throwaway copy of a cached
//! Debian root file system with systemd as init under `systemd-nspawn` (a network namespace of
//! its own, loopback only), and inside it installs the package and checks that the service
//! starts by itself, runs as the user `picomq` with its locked-memory limit and its data under
//! `/var/lib/picomq`, serves `pico create`/`append`/`read`, keeps its records over a restart
//! with a setting from `/etc/default/picomq`, a reload and a `kill -9`, stops on `dpkg -r` and
//! leaves nothing on `dpkg --purge`.
//!
//!     scripts/deb-rootfs.sh      # once: debootstrap, systemd-container, dpkg-dev, the tree
//!     cargo test -p pico-cli --test debian_package -- --include-ignored --nocapture
//!
//! Needs root. Without the tools or the tree the test skips with a note; under `CI=true` it
//! fails.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long the whole check may take (about 10 s on an idle 2-core machine).
const CHECK_TIMEOUT: Duration = Duration::from_secs(300);
/// After a SIGTERM at the timeout, how long the script has to stop its machine and unmount.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(45);
/// Where `scripts/deb-rootfs.sh` puts the tree when `PICOMQ_DEB_ROOTFS` does not say.
const DEFAULT_ROOTFS: &str = "/var/cache/picomq-deb/current-bookworm";
const HOW: &str = "scripts/deb-rootfs.sh installs it";

#[ignore = "needs root, systemd-nspawn and a Debian tree: scripts/deb-rootfs.sh"]
#[test]
fn the_debian_package_installs_a_service_that_serves_survives_restarts_and_purges_cleanly() {
    let test =
        "the_debian_package_installs_a_service_that_serves_survives_restarts_and_purges_cleanly";
    let Some(rootfs) = find_kit(test) else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = tempfile::NamedTempFile::new().expect("a file for the check's output");
    // A process group of its own, and SIGTERM when this process goes: either way the script's
    // trap stops the machine. Killed outright, the machine still goes: it lives in namespaces
    // that die with the script's unshare.
    let mut command = Command::new("bash");
    command
        .arg(root.join("scripts/deb-check.sh"))
        .env("PICO_BIN", env!("CARGO_BIN_EXE_pico"))
        .env("PICOMQ_DEB_ROOTFS", &rootfs)
        .stdin(Stdio::null())
        .stdout(out.reopen().expect("reopen the output file"))
        .stderr(out.reopen().expect("reopen the output file"))
        .process_group(0);
    // SAFETY: prctl(2) with plain integer arguments, async-signal-safe, between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("run scripts/deb-check.sh: {e}"));
    let status = wait_or_stop(&mut child);
    let output = std::fs::read_to_string(out.path()).unwrap_or_default();
    let Some(status) = status else {
        panic!("scripts/deb-check.sh did not finish within {CHECK_TIMEOUT:?}\n{output}");
    };
    assert!(status.success(), "scripts/deb-check.sh: {status}\n{output}");
    assert!(
        output.contains("deb-check: ok"),
        "scripts/deb-check.sh exited 0 without its final line\n{output}"
    );
    eprint!("{output}");
}

/// The tree to boot, or `None` (after a skip note; a failure under CI) when root, a tool or
/// the tree is missing.
fn find_kit(test: &str) -> Option<PathBuf> {
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        pico_testkit::missing_service(test, "needs root (mounts and namespaces)");
        return None;
    }
    for program in [
        "systemd-nspawn",
        "nsenter",
        "dpkg-deb",
        "dpkg-shlibdeps",
        "strip",
    ] {
        if !pico_testkit::require_program(test, program, HOW) {
            return None;
        }
    }
    let rootfs = std::env::var_os("PICOMQ_DEB_ROOTFS")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ROOTFS));
    if !rootfs.join(".picomq-ready").exists() {
        pico_testkit::missing_service(
            test,
            &format!(
                "needs a Debian tree in {} (PICOMQ_DEB_ROOTFS): run scripts/deb-rootfs.sh",
                rootfs.display()
            ),
        );
        return None;
    }
    Some(rootfs)
}

/// The script's exit status, or `None` when it ran past [`CHECK_TIMEOUT`]: then its group
/// gets SIGTERM (the script cleans up), and SIGKILL after [`CLEANUP_TIMEOUT`].
fn wait_or_stop(child: &mut Child) -> Option<ExitStatus> {
    if let Some(status) = wait_within(child, CHECK_TIMEOUT) {
        return Some(status);
    }
    let group = -(child.id() as i32);
    // SAFETY: kill(2) on the process group of our own child; no memory is involved.
    unsafe { libc::kill(group, libc::SIGTERM) };
    if wait_within(child, CLEANUP_TIMEOUT).is_none() {
        // SAFETY: as above.
        unsafe { libc::kill(group, libc::SIGKILL) };
        let _ = child.wait();
    }
    None
}

fn wait_within(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait for the check") {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

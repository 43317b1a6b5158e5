//! A small disk for storage-fault tests: a tmpfs mounted for one test (root only), and a
//! filler that keeps it full until released.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A tmpfs of `size_mib` mounted for one test; unmounted when dropped.
pub struct Tmpfs {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` (after saying why the test is skipped; a failure under `CI=true`) when this
    /// process may not mount.
    pub fn mount(test: &str, size_mib: u32) -> Option<Tmpfs> {
        let dir = tempfile::Builder::new()
            .prefix("pico-tmpfs-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("wal");
        std::fs::create_dir(&path).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(&path)
            .output();
        match mounted {
            Ok(out) if out.status.success() => Some(Tmpfs { path, _dir: dir }),
            Ok(out) => {
                let why = format!(
                    "needs to mount a tmpfs (root): {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
                skip_or_fail(test, &why);
                None
            }
            Err(e) => {
                skip_or_fail(test, &format!("needs `mount`: {e}"));
                None
            }
        }
    }
}

/// A machine where even root may not mount (an unprivileged container) cannot be given the
/// capability by `.ci/run`, which probes for it and then sets `PICO_TEST_NO_MOUNT`: such a
/// run says what it skipped instead of failing. Anywhere else a missing mount fails under CI.
fn skip_or_fail(test: &str, why: &str) {
    if std::env::var_os("PICO_TEST_NO_MOUNT").is_some() {
        eprintln!("{test}: skipped: {why} (PICO_TEST_NO_MOUNT: this machine cannot mount)");
    } else {
        pico_testkit::missing_service(test, why);
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).output();
    }
}

/// Keeps a filesystem full: writes to a file of its own whenever there is room, until
/// stopped (bounded by `FILLER_LIFETIME`). Space the node frees (an uploaded segment's WAL
/// file) is taken back at once, so the disk stays full until the test lets it go.
pub struct Filler {
    stop: Arc<AtomicBool>,
    full: Arc<AtomicBool>,
    path: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

const FILLER_LIFETIME: Duration = Duration::from_secs(180);

impl Filler {
    pub fn start(dir: &Path) -> Filler {
        let path = dir.join("filler");
        let stop = Arc::new(AtomicBool::new(false));
        let full = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stop, full, path) = (stop.clone(), full.clone(), path.clone());
            std::thread::spawn(move || {
                let mut file = std::fs::File::create(&path).unwrap();
                let chunk = vec![0u8; 16 * 1024];
                let deadline = Instant::now() + FILLER_LIFETIME;
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    if file.write_all(&chunk).is_err() {
                        full.store(true, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
            })
        };
        Filler {
            stop,
            full,
            path,
            thread: Some(thread),
        }
    }

    pub fn wait_full(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.full.load(Ordering::Relaxed) {
            assert!(
                Instant::now() < deadline,
                "the filler never filled the disk"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops filling and frees what it took.
    pub fn release(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        std::fs::remove_file(&self.path).unwrap();
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

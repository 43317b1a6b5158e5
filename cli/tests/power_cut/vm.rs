//! A virtual machine whose disk loses what it was not told to keep, for the power-cut test.
//!
//! The guest is a Debian kernel (unpacked by `scripts/power-cut-vm.sh`, never installed here)
//! with an initramfs the test builds: a static busybox, the kernel modules for a virtio disk
//! and network card and ext4, the test's own `pico` binary with its shared libraries, and an
//! `/init` script that mounts the data disk at `/data` and runs `pico serve` on it. qemu
//! emulates the machine in software (TCG: this machine's `/dev/kvm` does not boot a stock
//! kernel) and forwards three ports of 127.0.0.1 to the node's Pico, Durable Streams and admin
//! listeners.
//!
//! The disk is an ext4 image in a file, served to qemu by nbdkit over a unix socket through
//! its cache filter in `cache=writeback` mode: writes stay in nbdkit's cache (a temporary file
//! it has already unlinked) until the guest flushes, and only a flush writes them to the
//! image. Killing nbdkit drops every block the guest had not flushed, like a disk's volatile
//! write cache on a power loss; killing qemu then stops the machine. (A plain image file
//! cannot lose anything: qemu's writes land in the host's page cache, which outlives qemu.)
//! With [`DiskCache::IgnoresFlushes`] (`cache=unsafe`) flushes are not honoured at all, so a
//! cut loses everything since the boot: the control that shows the test can see a loss.
//!
//! Every process started here is killed (SIGKILL) when its guard drops, panics included, and
//! dies with the test process too (`PR_SET_PDEATHSIG`).

use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::Conn;

/// Where `scripts/power-cut-vm.sh` puts the kernel when `PICOMQ_VM_DIR` does not say.
const DEFAULT_KERNEL_DIR: &str = "/var/cache/picomq-vm/current";
/// How long a boot may take until the node's `/ready` answers `200`: about 10-25 s on this
/// machine kind under software emulation, more on a busy CI machine.
const BOOT_BOUND: Duration = Duration::from_secs(240);
/// The guest's ports the node listens on (forwarded from 127.0.0.1).
const GUEST_PICO_PORT: u16 = 4437;
const GUEST_DS_PORT: u16 = 4438;
const GUEST_ADMIN_PORT: u16 = 9090;
/// What the guest's init prints just before it starts `pico serve`.
const STARTING: &str = "pico-vm: starting pico serve";
/// The data disk's size (a sparse file).
const DISK_MIB: u64 = 1024;

/// What the guest is built from.
pub struct Kit {
    kernel: PathBuf,
    /// The modules to load, in order.
    modules: Vec<PathBuf>,
    busybox: PathBuf,
}

impl Kit {
    /// The kernel, the modules and the host programs, or `None` after a skip note (a failure
    /// under `CI=true`, whose `.ci/run` prepares them all).
    pub fn find(test: &str) -> Option<Kit> {
        const HOW: &str = "scripts/power-cut-vm.sh installs it";
        for program in ["qemu-system-x86_64", "nbdkit", "cpio", "mkfs.ext4"] {
            if !pico_testkit::require_program(test, program, HOW) {
                return None;
            }
        }
        let busybox = PathBuf::from("/bin/busybox");
        if !busybox.exists() {
            pico_testkit::missing_service(test, &format!("needs /bin/busybox ({HOW})"));
            return None;
        }
        let dir = std::env::var_os("PICOMQ_VM_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_KERNEL_DIR));
        let order = std::fs::read_to_string(dir.join("modules/order"));
        let (true, Ok(order)) = (dir.join("ready").exists(), order) else {
            pico_testkit::missing_service(
                test,
                &format!(
                    "needs a kernel in {} (PICOMQ_VM_DIR): run scripts/power-cut-vm.sh",
                    dir.display()
                ),
            );
            return None;
        };
        let modules = order
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|name| dir.join("modules").join(name.trim()))
            .collect();
        Some(Kit {
            kernel: dir.join("vmlinuz"),
            modules,
            busybox,
        })
    }

    /// Builds an initramfs in `dir` whose `/init` runs `pico serve` with `pico_args` on the
    /// data disk; returns its path.
    fn initramfs(&self, dir: &Path, pico_args: &[String]) -> PathBuf {
        let root = dir.join("initramfs");
        for sub in ["bin", "lib/modules", "proc", "sys", "dev", "data", "tmp"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        copy(&self.busybox, &root.join("bin/busybox"));
        let pico = Path::new(env!("CARGO_BIN_EXE_pico"));
        // Without its debug information the binary is a third of the size, and so is the
        // initramfs every boot unpacks.
        let stripped = Command::new("strip")
            .arg("-o")
            .arg(root.join("bin/pico"))
            .arg(pico)
            .status()
            .is_ok_and(|s| s.success());
        if !stripped {
            copy(pico, &root.join("bin/pico"));
        }
        for binary in [pico, self.busybox.as_path()] {
            for library in shared_libraries(binary) {
                let inside = root.join(library.strip_prefix("/").unwrap());
                std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
                copy(&library, &inside);
            }
        }
        let mut order = String::new();
        for module in &self.modules {
            let name = module.file_name().unwrap();
            copy(module, &root.join("lib/modules").join(name));
            order.push_str(&format!("{}\n", name.to_string_lossy()));
        }
        std::fs::write(root.join("lib/modules/order"), order).unwrap();
        for arg in pico_args {
            assert!(
                !arg.is_empty() && arg.chars().all(|c| c.is_ascii_graphic() && c != '\''),
                "a pico flag the init script cannot carry: {arg:?}"
            );
        }
        let init = format!(
            r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
exec >/dev/console 2>&1 </dev/null
while read module; do
  insmod /lib/modules/$module || echo "pico-vm: insmod $module failed"
done </lib/modules/order
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
if ! mount -t ext4 /dev/vda /data; then
  echo "pico-vm: cannot mount the data disk"
  poweroff -f
fi
ulimit -l unlimited
cd /data
echo "{STARTING}"
/bin/pico serve --listen 0.0.0.0:{GUEST_PICO_PORT} --ds-listen 0.0.0.0:{GUEST_DS_PORT} --admin-listen 0.0.0.0:{GUEST_ADMIN_PORT} --insecure-allow-remote --meta-url sqlite:/data/meta.db --storage -2@file:///data/objects --wal-dir /data/wal {args}
echo "pico-vm: pico serve exited with status $?"
poweroff -f
"#,
            args = pico_args.join(" ")
        );
        let init_path = root.join("init");
        std::fs::write(&init_path, init).unwrap();
        set_mode(&init_path, 0o755);
        let image = dir.join("initramfs.cpio");
        let out = std::fs::File::create(&image).unwrap();
        let status = Command::new("sh")
            .args(["-c", "find . | cpio -o -H newc --quiet"])
            .current_dir(&root)
            .stdout(out)
            .status()
            .expect("run cpio");
        assert!(status.success(), "cpio failed: {status}");
        std::fs::remove_dir_all(&root).unwrap();
        image
    }
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The shared libraries `binary` loads (the dynamic loader included), as `ldd` resolves them
/// on this machine; none for a static binary.
fn shared_libraries(binary: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(binary).output().expect("run ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let path = match line.split_once("=>") {
                Some((_, resolved)) => resolved.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// How the disk's cache treats the guest's flushes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskCache {
    /// Written to the image on each flush: a disk with a volatile write cache.
    Writeback,
    /// Never written to the image: a disk that acknowledges flushes and keeps nothing.
    IgnoresFlushes,
}

/// A machine: its disk image and initramfs, and the processes of its current boot.
pub struct Machine {
    kernel: PathBuf,
    initramfs: PathBuf,
    disk: PathBuf,
    cache: DiskCache,
    boots: u32,
    running: Option<Running>,
    // Dropped last; kept on disk (`keep`) when the test fails, for a post-mortem.
    dir: Option<tempfile::TempDir>,
}

struct Running {
    nbdkit: Child,
    qemu: Child,
}

/// A booted machine's forwarded listeners.
#[derive(Clone, Copy, Debug)]
pub struct Node {
    pub pico: SocketAddr,
    pub ds: SocketAddr,
    pub admin: SocketAddr,
}

impl Machine {
    /// A machine with a fresh ext4 disk whose init runs `pico serve` with `pico_args`.
    pub fn new(kit: &Kit, name: &str, pico_args: &[String], cache: DiskCache) -> Machine {
        let dir = tempfile::Builder::new()
            .prefix(&format!("pico-power-cut-{name}-"))
            .tempdir()
            .unwrap();
        let initramfs = kit.initramfs(dir.path(), pico_args);
        let disk = dir.path().join("disk.img");
        std::fs::File::create(&disk)
            .unwrap()
            .set_len(DISK_MIB << 20)
            .unwrap();
        // The inode tables and the journal written now, so the guest's lazy initialisation
        // does not add writes of its own to every boot.
        let out = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
            .arg(&disk)
            .output()
            .expect("run mkfs.ext4");
        assert!(
            out.status.success(),
            "mkfs.ext4: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Machine {
            kernel: kit.kernel.clone(),
            initramfs,
            disk,
            cache,
            boots: 0,
            running: None,
            dir: Some(dir),
        }
    }

    fn dir(&self) -> &Path {
        self.dir.as_ref().expect("the machine's directory").path()
    }

    /// Boots the machine and waits (bounded) until its node answers `/ready` with `200`.
    /// Panics with the console when the node does not come up (it refused to start, say),
    /// keeping the machine's directory (disk image, consoles) for a post-mortem.
    pub fn boot(&mut self) -> Node {
        assert!(self.running.is_none(), "the machine runs already");
        // A forwarded port another process took between our probe and qemu's bind makes qemu
        // exit at once: try again on other ports.
        for _ in 0..3 {
            self.boots += 1;
            let [pico, ds, admin] = free_ports();
            let node = Node { pico, ds, admin };
            let running = self.start(node);
            self.running = Some(running);
            match self.wait_ready(node) {
                Ok(()) => return node,
                Err(why) if why.contains("hostfwd") || why.contains("host forwarding") => {
                    self.stop();
                    continue;
                }
                Err(why) => {
                    let console = self.console();
                    self.stop();
                    let kept = self.keep();
                    panic!(
                        "boot {} did not come up: {why}\nthe machine's directory is kept at \
                         {kept} (disk.img, consoles)\n--- console ---\n{console}",
                        self.boots
                    );
                }
            }
        }
        panic!("qemu could not forward a port three times");
    }

    /// Boots the machine and cuts the power `after` its init started `pico serve`, so that
    /// the cut lands in the node's recovery or start-up; whether the node was serving by
    /// then (its `serving on` line). Panics when the guest does not get that far (bounded),
    /// keeping the machine's directory.
    pub fn cut_while_starting(&mut self, after: Duration) -> bool {
        assert!(self.running.is_none(), "the machine runs already");
        self.boots += 1;
        let [pico, ds, admin] = free_ports();
        self.running = Some(self.start(Node { pico, ds, admin }));
        let deadline = Instant::now() + BOOT_BOUND;
        while !self.console().contains(STARTING) {
            let running = self.running.as_mut().expect("a boot");
            let exited = matches!(running.qemu.try_wait(), Ok(Some(_)));
            if exited || Instant::now() > deadline {
                let console = self.console();
                self.stop();
                let kept = self.keep();
                panic!(
                    "boot {} did not start pico serve (qemu exited: {exited}); the machine's \
                     directory is kept at {kept}\n--- console ---\n{console}",
                    self.boots
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(after);
        let serving = self.console().contains("serving on ");
        self.power_cut();
        serving
    }

    fn start(&self, node: Node) -> Running {
        let dir = self.dir();
        let socket = dir.join("nbd.sock");
        let _ = std::fs::remove_file(&socket);
        let cache = match self.cache {
            DiskCache::Writeback => "cache=writeback",
            DiskCache::IgnoresFlushes => "cache=unsafe",
        };
        let nbdkit_log = std::fs::File::create(dir.join(format!("nbdkit-{}.log", self.boots)))
            .expect("create the nbdkit log");
        let mut nbdkit = Command::new("nbdkit");
        nbdkit
            .args(["--foreground", "--unix"])
            .arg(&socket)
            .args(["--filter=cache", "file"])
            .arg(format!("file={}", self.disk.display()))
            // Cache blocks of 4 KiB, the guest's block size: a lost block is one the guest
            // wrote, not 64 KiB around it.
            .args([cache, "cache-min-block-size=4096"])
            // The cache file lives (unlinked) with the machine.
            .env("TMPDIR", dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(nbdkit_log);
        let nbdkit = spawn_dying_with_us(&mut nbdkit, "nbdkit");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "nbdkit did not make its socket: {}",
                std::fs::read_to_string(dir.join(format!("nbdkit-{}.log", self.boots)))
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let console = dir.join(format!("console-{}.log", self.boots));
        let qemu_log = std::fs::File::create(dir.join(format!("qemu-{}.log", self.boots)))
            .expect("create the qemu log");
        let mut qemu = Command::new("qemu-system-x86_64");
        qemu.args(["-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2"])
            .args(["-m", "1024", "-nodefaults", "-no-user-config", "-no-reboot"])
            .args(["-display", "none", "-monitor", "none"])
            .arg("-kernel")
            .arg(&self.kernel)
            .arg("-initrd")
            .arg(&self.initramfs)
            .args(["-append", "console=ttyS0 quiet panic=-1"])
            .arg("-drive")
            .arg(format!(
                "file=nbd:unix:{},format=raw,if=virtio,cache=writeback",
                socket.display()
            ))
            .arg("-netdev")
            .arg(format!(
                "user,id=net0,hostfwd=tcp:127.0.0.1:{}-:{GUEST_PICO_PORT},\
                 hostfwd=tcp:127.0.0.1:{}-:{GUEST_DS_PORT},\
                 hostfwd=tcp:127.0.0.1:{}-:{GUEST_ADMIN_PORT}",
                node.pico.port(),
                node.ds.port(),
                node.admin.port()
            ))
            // No option ROM: the guest boots from -kernel, not the network.
            .args(["-device", "virtio-net-pci,netdev=net0,romfile="])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(qemu_log);
        let qemu = spawn_dying_with_us(&mut qemu, "qemu-system-x86_64");
        Running { nbdkit, qemu }
    }

    fn wait_ready(&mut self, node: Node) -> Result<(), String> {
        let deadline = Instant::now() + BOOT_BOUND;
        let boots = self.boots;
        loop {
            let running = self.running.as_mut().expect("a boot");
            if let Ok(Some(status)) = running.qemu.try_wait() {
                let log = std::fs::read_to_string(
                    self.dir
                        .as_ref()
                        .unwrap()
                        .path()
                        .join(format!("qemu-{boots}.log")),
                )
                .unwrap_or_default();
                return Err(format!("qemu exited ({status}): {log}"));
            }
            if let Ok(Some(status)) = running.nbdkit.try_wait() {
                return Err(format!("nbdkit exited ({status})"));
            }
            if ready(node.admin) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("/ready did not answer 200 within {BOOT_BOUND:?}"));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Cuts the power: kills nbdkit (the disk's unflushed cache is gone), then qemu.
    pub fn power_cut(&mut self) {
        let mut running = self.running.take().expect("a running machine");
        kill(&mut running.nbdkit);
        kill(&mut running.qemu);
    }

    /// Stops whatever runs, the disk first (as a power cut does).
    fn stop(&mut self) {
        if let Some(mut running) = self.running.take() {
            kill(&mut running.nbdkit);
            kill(&mut running.qemu);
        }
    }

    /// The console of the latest boot (the kernel's messages and the node's log).
    pub fn console(&self) -> String {
        let path = self.dir().join(format!("console-{}.log", self.boots));
        let text = std::fs::read(path).unwrap_or_default();
        String::from_utf8_lossy(&text).into_owned()
    }

    /// Keeps the machine's directory after the test (for a post-mortem); its path.
    pub fn keep(&mut self) -> String {
        match self.dir.take() {
            Some(dir) => dir.keep().display().to_string(),
            None => "(kept already)".to_string(),
        }
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts `command` so that it gets SIGKILL when this process's spawning thread ends: a test
/// killed outright leaves no qemu or nbdkit behind.
fn spawn_dying_with_us(command: &mut Command, what: &str) -> Child {
    // SAFETY: prctl(2) with plain integer arguments, async-signal-safe, between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"))
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Three distinct ports of 127.0.0.1 that were free a moment ago.
fn free_ports() -> [SocketAddr; 3] {
    let bind = || TcpListener::bind("127.0.0.1:0").expect("a free port on 127.0.0.1");
    let sockets = [bind(), bind(), bind()];
    sockets.map(|socket| socket.local_addr().unwrap())
}

/// Whether the node's `/ready` answers `200` (a forwarded port accepts even before the guest
/// listens, then drops the connection).
fn ready(admin: SocketAddr) -> bool {
    let Ok(mut conn) = Conn::connect(admin) else {
        return false;
    };
    conn.set_read_timeout(Duration::from_secs(3));
    conn.request("GET", "/ready", &[], b"")
        .is_ok_and(|r| r.status == 200)
}

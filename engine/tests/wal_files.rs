//! How WAL files are made ready, read from the filesystem's extent map (`FIEMAP`) of the real
//! files: a writer that fills segments by size in small commit rounds gets files written
//! through with zeros, so a commit round overwrites written blocks; a slow writer's files
//! (its segments seal by age) and a writer of large rounds' get only their head written
//! through (`WAL_HEAD_WRITTEN_BYTES`), the rest reserved. Every acknowledged record reads
//! back either way.

mod common;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use common::{append_request, create_request, read_bodies, record, run_returning, wal_files};
use pico_engine::limits::WAL_HEAD_WRITTEN_BYTES;
use pico_engine::EngineConfig;

/// `FS_IOC_FIEMAP`: `_IOWR('f', 11, struct fiemap)`.
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
/// `fm_flags`: write the file's dirty pages first.
const FIEMAP_FLAG_SYNC: u32 = 0x1;
/// `fe_flags`: the extent is reserved but reads as zeros (never written).
const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;
/// Extents asked for at once; WAL files here have a handful.
const EXTENTS_MAX: usize = 64;

/// `struct fiemap` (linux/fiemap.h) with room for [`EXTENTS_MAX`] extents.
#[repr(C)]
struct Fiemap {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
    extents: [FiemapExtent; EXTENTS_MAX],
}

/// `struct fiemap_extent`.
#[repr(C)]
#[derive(Clone, Copy)]
struct FiemapExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

/// Bytes of `path` in written and in unwritten extents; `None` where the filesystem has no
/// extent map (tmpfs) and the test has nothing to look at.
fn extent_bytes(path: &Path) -> Option<(u64, u64)> {
    let file = std::fs::File::open(path).unwrap();
    let empty = FiemapExtent {
        logical: 0,
        physical: 0,
        length: 0,
        reserved64: [0; 2],
        flags: 0,
        reserved: [0; 3],
    };
    let mut map = Box::new(Fiemap {
        start: 0,
        length: u64::MAX,
        flags: FIEMAP_FLAG_SYNC,
        mapped_extents: 0,
        extent_count: EXTENTS_MAX as u32,
        reserved: 0,
        extents: [empty; EXTENTS_MAX],
    });
    // SAFETY: `map` is a `struct fiemap` followed by room for `extent_count` extents, live
    // and exclusively borrowed for the call, which writes only within it.
    let done = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP, &mut *map as *mut Fiemap) };
    if done != 0 {
        let error = std::io::Error::last_os_error();
        assert_eq!(
            error.raw_os_error(),
            Some(libc::EOPNOTSUPP),
            "FIEMAP on {}: {error}",
            path.display()
        );
        return None;
    }
    let mapped = (map.mapped_extents as usize).min(EXTENTS_MAX);
    let (mut written, mut unwritten) = (0, 0);
    for extent in &map.extents[..mapped] {
        if extent.flags & FIEMAP_EXTENT_UNWRITTEN != 0 {
            unwritten += extent.length;
        } else {
            written += extent.length;
        }
    }
    Some((written, unwritten))
}

/// Each WAL file with its written and unwritten extent bytes (`None`: no extent map).
type WalMaps = Vec<(PathBuf, Option<(u64, u64)>)>;

/// The files of `maps` that have an extent map, with their written and unwritten bytes;
/// `None` (the test is skipped, and says so) when none has one.
fn mapped(maps: &WalMaps) -> Option<Vec<(&PathBuf, (u64, u64))>> {
    let mapped: Vec<_> = maps.iter().filter_map(|(p, m)| Some((p, (*m)?))).collect();
    if mapped.is_empty() {
        eprintln!("skipped: the test directory's filesystem has no extent map (FIEMAP)");
        return None;
    }
    Some(mapped)
}

/// A one-core engine with 64 KiB segments, sealed by age after `age_ms`.
fn config(dir: &Path, age_ms: u64) -> EngineConfig {
    EngineConfig {
        segment_max_age_ms: age_ms,
        ..common::config(dir, 1)
    }
}

/// Appends `count` records of `size` bytes to `/s` one after another (each acknowledged
/// before the next), pausing `pause_ms` after each; then the WAL files' extent bytes by
/// file, and every record read back.
fn write_then_map(
    dir: &Path,
    config: EngineConfig,
    count: usize,
    size: usize,
    pause_ms: u64,
) -> (WalMaps, Vec<bytes::Bytes>) {
    let wal = dir.to_path_buf();
    run_returning(config, dir, move |core, _| async move {
        core.create("/s", create_request("application/octet-stream"))
            .await
            .unwrap();
        for i in 0..count {
            let body = vec![b'a' + (i % 26) as u8; size];
            core.append("/s", append_request(vec![record(body)], false))
                .await
                .unwrap();
            if pause_ms > 0 {
                glommio::timer::sleep(std::time::Duration::from_millis(pause_ms)).await;
            }
        }
        // The commit loop makes the next file ready once it is idle.
        glommio::timer::sleep(std::time::Duration::from_millis(100)).await;
        let maps = wal_files(&wal)
            .into_iter()
            .map(|path| {
                let map = extent_bytes(&path);
                (path, map)
            })
            .collect();
        let bodies = read_bodies(&core, "/s", 1 << 20).await;
        (maps, bodies.into_iter().map(|(_, body)| body).collect())
    })
}

/// Every record of [`write_then_map`] came back as written.
fn assert_read_back(bodies: &[bytes::Bytes], count: usize, size: usize) {
    assert_eq!(bodies.len(), count);
    for (i, body) in bodies.iter().enumerate() {
        assert_eq!(body.len(), size, "record {i}");
        assert!(
            body.iter().all(|b| *b == b'a' + (i % 26) as u8),
            "record {i}"
        );
    }
}

#[test]
fn a_writer_that_fills_segments_gets_wal_files_written_through() {
    let dir = tempfile::tempdir().unwrap();
    // 4 KiB records, 64 KiB segments sealed by size only: ~10 segments.
    let (count, size) = (160, 4096);
    let (maps, bodies) = write_then_map(dir.path(), config(dir.path(), 60_000), count, size, 0);
    assert_read_back(&bodies, count, size);
    let Some(mapped) = mapped(&maps) else {
        return;
    };
    // The first file is made at start, before anything is known of the writer; each one made
    // after a full segment was left behind is written through, the spare included.
    let later: Vec<_> = mapped.iter().skip(1).collect();
    assert!(!later.is_empty(), "no WAL file after the first: {maps:?}");
    for (path, (written, unwritten)) in later {
        assert_eq!(
            *unwritten,
            0,
            "{} has {unwritten} unwritten bytes ({written} written)",
            path.display()
        );
        assert!(*written > 0, "{} has no blocks", path.display());
    }
}

#[test]
fn a_slow_writers_wal_files_have_their_head_written_through() {
    let dir = tempfile::tempdir().unwrap();
    // Small records 60 ms apart with segments sealed after 50 ms: each segment seals by age
    // holding a record or two, far from half full.
    let (count, size) = (8, 100);
    let (maps, bodies) = write_then_map(dir.path(), config(dir.path(), 50), count, size, 60);
    assert_read_back(&bodies, count, size);
    let Some(mapped) = mapped(&maps) else {
        return;
    };
    let head = WAL_HEAD_WRITTEN_BYTES as u64;
    for (path, (written, unwritten)) in mapped {
        // Written: the head, where the rounds (a few records and commit records each) land.
        assert!(
            (head..=head + 64 * 1024).contains(&written),
            "{} has {written} written bytes ({unwritten} unwritten), not its head",
            path.display()
        );
        assert!(
            unwritten > 0,
            "{} has no unwritten extent ({written} written)",
            path.display()
        );
    }
}

#[test]
fn a_writer_of_large_rounds_gets_wal_files_reserved_past_their_head() {
    let dir = tempfile::tempdir().unwrap();
    // 96 KiB records, each its own commit round, filling 1 MiB segments by size: a file
    // written through would cost more than the rounds save (`WAL_FILL_ROUND_BYTES_MAX`).
    let (count, size) = (30, 96 * 1024);
    let config = EngineConfig {
        segment_size: 1 << 20,
        ..config(dir.path(), 60_000)
    };
    let (maps, bodies) = write_then_map(dir.path(), config, count, size, 0);
    assert_read_back(&bodies, count, size);
    let Some(mapped) = mapped(&maps) else {
        return;
    };
    assert!(mapped.len() >= 2, "no WAL file after the first: {maps:?}");
    for (path, (written, unwritten)) in mapped {
        assert!(
            unwritten > 0,
            "{} has no unwritten extent ({written} written): written through",
            path.display()
        );
        assert!(
            written >= WAL_HEAD_WRITTEN_BYTES as u64,
            "{} has {written} written bytes: its head is not written through",
            path.display()
        );
    }
}

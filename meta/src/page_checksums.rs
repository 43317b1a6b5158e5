//! Page checksums for the SQLite catalog: a flipped bit or a misdirected write in `meta.db` is
//! refused when the page is read, instead of being read as a catalog that says something else
//! (a stream's records placed elsewhere, a stream's tail lowered so its next append is given
//! an offset again). SQLite keeps no checksum of its own on database pages; its WAL frames
//! have one, and a damaged WAL frame ends the replay, which `high_water.rs` catches.
//!
//! A VFS shim over the process's default one: for a main database file whose header reserves
//! [`CHECKSUM_BYTES`] at the end of every page, each whole page written gets them filled in,
//! and each whole page read is checked against them. Pages written to the database's WAL get
//! them filled in too (below). Other files (the journal, temporary files) and databases without
//! the reserve pass through unchanged.
//!
//! ```text
//! one page of a checked database file (page_bytes, a power of two, 512..=65536):
//! ┌──────────────────────────────────────┬──────────────────────┬──────────────────────┐
//! │ the page as SQLite made it           │ crc32c               │ page number          │
//! │ page_bytes - 8 bytes                 │ of the bytes before  │ (1-based, offset /   │
//! │                                      │ and the page number, │ page_bytes + 1), u32 │
//! │                                      │ u32 little-endian    │ little-endian        │
//! └──────────────────────────────────────┴──────────────────────┴──────────────────────┘
//! the database header (page 1): page size at bytes 16..18 (big-endian, 1 = 65536), bytes
//! reserved at the end of each page at byte 20 (8 here)
//! ```
//!
//! Pages go to the WAL before they reach the file, and whoever checkpoints copies them into the
//! file as they are in the WAL: another SQLite program (the `sqlite3` shell, a script) that
//! opens the catalog after a crash and closes it last checkpoints it without this shim. So a
//! page carries its checksum in its WAL frame already, and the frame's own checksum (SQLite's,
//! cumulative over the frames, which SQLite computed over the page before the shim filled its
//! reserve in) is computed again over the page as written, chained from the frame before it
//! as the file holds it:
//!
//! ```text
//! the WAL: a 32-byte header, then frames of a 24-byte header and a page
//! header:  magic u32 BE (0x377f0682; 0x377f0683: checksum words big-endian, else little)
//!          | version | page size u32 BE | checkpoint seq | salt-1 | salt-2
//!          | checksum-1, checksum-2 u32 BE (of the 24 bytes before)
//! frame:   page number u32 BE | database size after a commit (else 0) | salt-1 | salt-2
//!          | checksum-1, checksum-2 u32 BE: (s1, s2) from the previous frame's (the header's
//!            for frame 1), over the frame header's first 8 bytes then the page, two words at
//!            a time: s1 += w0 + s2; s2 += w1 + s1
//!          | the page (its reserve filled in by the shim)
//! ```
//!
//! SQLite writes a frame's header and its page in two writes, one after the other: the shim
//! holds the header until the page comes and writes both at once. A header whose salts and
//! checksum are zeros (a page written again within one transaction, whose checksums SQLite
//! computes again from the file at commit) is written as it is.
//!
//! The page number in the checksum catches a page written at the wrong place. A catalog made
//! before the shim gets the reserve once (`ensure`: one `VACUUM` rewriting it); the schema
//! version that came with it (14) keeps an older build, which would write pages without their
//! checksums, from opening it.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use rusqlite::ffi;
use rusqlite::Connection;

use crate::MetaError;

/// Bytes reserved at the end of every page of a checked database file.
pub(crate) const CHECKSUM_BYTES: u8 = 8;
/// The shim's name among the process's VFSes.
const VFS_NAME: &CStr = c"picomq-page-checksums";
/// A file control of this shim (outside SQLite's range): the reserve the file's header names,
/// as the shim last saw it (`-1` before the header was read).
const FCNTL_RESERVED_BYTES: c_int = 0x7069_6301;
/// The smallest page SQLite makes; the header is within it.
const PAGE_BYTES_MIN: u32 = 512;
/// Bytes of the database header at the start of page 1.
const HEADER_BYTES: usize = 100;

/// One open file: the shim's part, then the underlying VFS's file (`szOsFile` bytes).
#[repr(C)]
struct CheckedFile {
    base: ffi::sqlite3_file,
    /// The underlying VFS's file, in the same allocation right after this struct.
    real: *mut ffi::sqlite3_file,
    /// A main database file (only those are checked).
    main_db: bool,
    /// From the header, once seen; 0 before.
    page_bytes: u32,
    /// Bytes reserved at the end of each page, from the header; -1 before it was seen.
    reserved: i32,
    /// A WAL file (`page_bytes` and `reserved` then come from the WAL's header and from the
    /// frames of page 1 it wrote, else from its database file).
    wal: bool,
    /// A WAL's database file (the shim's, which SQLite closes after its WAL).
    database: *mut ffi::sqlite3_file,
    /// A WAL's checksum words are big-endian (its header's magic says so).
    big_endian_sums: bool,
    /// A WAL frame header SQLite wrote, held until its page comes: where, and the bytes.
    pending_header: Option<(i64, [u8; WAL_FRAME_HEADER_BYTES])>,
}

/// Bytes of a WAL file's header, and of each frame's header.
const WAL_HEADER_BYTES: i64 = 32;
const WAL_FRAME_HEADER_BYTES: usize = 24;
/// A WAL header's magic number; its lowest bit set: big-endian checksum words.
const WAL_MAGIC: u32 = 0x377f_0682;

/// Where the underlying file starts inside the shim's allocation (8-byte aligned).
const REAL_OFFSET: usize = std::mem::size_of::<CheckedFile>().next_multiple_of(8);

/// Registers the shim as the process's default VFS, once; later SQLite connections of this
/// process (the catalog, its backups, restores) read and write through it.
pub(crate) fn register() -> Result<(), MetaError> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            // SAFETY: sqlite3_vfs_find returns SQLite's static default VFS (or null); the shim
            // copies it into a leaked box that lives as long as the process, as SQLite requires
            // of a registered VFS, and registers that.
            unsafe {
                let real = ffi::sqlite3_vfs_find(std::ptr::null());
                if real.is_null() {
                    return Err("SQLite has no default VFS".to_string());
                }
                let mut vfs = *real;
                vfs.iVersion = vfs.iVersion.min(2);
                vfs.szOsFile = c_int::try_from(REAL_OFFSET)
                    .ok()
                    .and_then(|own| own.checked_add((*real).szOsFile))
                    .ok_or("the default VFS's file is too large")?;
                vfs.pNext = std::ptr::null_mut();
                vfs.zName = VFS_NAME.as_ptr();
                vfs.pAppData = real.cast();
                vfs.xOpen = Some(open);
                vfs.xDelete = Some(delete);
                vfs.xAccess = Some(access);
                vfs.xFullPathname = Some(full_pathname);
                vfs.xDlOpen = None;
                vfs.xDlError = None;
                vfs.xDlSym = None;
                vfs.xDlClose = None;
                vfs.xRandomness = Some(randomness);
                vfs.xSleep = Some(sleep);
                vfs.xCurrentTime = Some(current_time);
                vfs.xGetLastError = Some(get_last_error);
                vfs.xCurrentTimeInt64 = Some(current_time_int64);
                vfs.xSetSystemCall = None;
                vfs.xGetSystemCall = None;
                vfs.xNextSystemCall = None;
                let vfs = Box::leak(Box::new(vfs));
                match ffi::sqlite3_vfs_register(vfs, 1) {
                    ffi::SQLITE_OK => Ok(()),
                    rc => Err(format!("register the page-checksum VFS: SQLite error {rc}")),
                }
            }
        })
        .clone()
        .map_err(MetaError::Storage)
}

/// Gives a file catalog its page checksums: a new (empty) one is made with the reserve; one
/// made before gets it by one `VACUUM`, which rewrites every page. Run right after opening,
/// before anything else reads or writes.
pub(crate) fn ensure(conn: &Connection, path: &std::path::Path) -> Result<(), MetaError> {
    let pages: i64 = conn
        .query_row("PRAGMA page_count", [], |row| row.get(0))
        .map_err(crate::schema::storage("read the catalog's page count"))?;
    let wanted = c_int::from(CHECKSUM_BYTES);
    if pages == 0 {
        set_reserve(conn, wanted)?;
        return Ok(());
    }
    if reserved_bytes(conn)? == wanted {
        return Ok(());
    }
    let started = std::time::Instant::now();
    set_reserve(conn, wanted)?;
    // The rewrite goes to the WAL; the checkpoint puts it, header first, in the file.
    conn.execute_batch("VACUUM")
        .map_err(crate::schema::storage(
            "rewrite the catalog with page checksums",
        ))?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .map_err(crate::schema::storage("checkpoint the rewritten catalog"))?;
    let now = reserved_bytes(conn)?;
    if now != wanted {
        return Err(MetaError::Storage(format!(
            "{}: the catalog reserves {now} bytes a page after its rewrite, not the \
             {wanted} its page checksums need",
            path.display()
        )));
    }
    log::info!(
        "catalog {}: {pages} pages rewritten with page checksums in {:.1} s (once)",
        path.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The bytes the main database's header reserves at the end of each page, as the shim saw
/// them (the header is read by the query that counts the pages).
fn reserved_bytes(conn: &Connection) -> Result<c_int, MetaError> {
    let mut reserved: c_int = -1;
    // SAFETY: the connection's handle is valid while `conn` lives; the file control writes one
    // c_int through the pointer, which points at a local of that type.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            FCNTL_RESERVED_BYTES,
            (&mut reserved as *mut c_int).cast(),
        )
    };
    if rc != ffi::SQLITE_OK {
        return Err(MetaError::Storage(format!(
            "the catalog is not opened through the page-checksum VFS (SQLite error {rc})"
        )));
    }
    Ok(reserved)
}

fn set_reserve(conn: &Connection, bytes: c_int) -> Result<(), MetaError> {
    let mut n = bytes;
    // SAFETY: as in `reserved_bytes`; SQLITE_FCNTL_RESERVE_BYTES reads and writes one c_int.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_RESERVE_BYTES,
            (&mut n as *mut c_int).cast(),
        )
    };
    match rc {
        ffi::SQLITE_OK => Ok(()),
        rc => Err(MetaError::Storage(format!(
            "reserve {bytes} bytes a page for the catalog's checksums: SQLite error {rc}"
        ))),
    }
}

/// The checksum bytes of a page: `data` is the page less its last [`CHECKSUM_BYTES`].
fn page_checksum(data: &[u8], page_no: u32) -> [u8; CHECKSUM_BYTES as usize] {
    let crc = crc32c::crc32c_append(crc32c::crc32c(data), &page_no.to_le_bytes());
    let mut out = [0u8; CHECKSUM_BYTES as usize];
    out[..4].copy_from_slice(&crc.to_le_bytes());
    out[4..].copy_from_slice(&page_no.to_le_bytes());
    out
}

/// The page size and reserve a database header names; `None` if `header` is not one.
fn header_fields(header: &[u8]) -> Option<(u32, i32)> {
    if header.len() < HEADER_BYTES || !header.starts_with(b"SQLite format 3\0") {
        return None;
    }
    let page_bytes = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536,
        n => u32::from(n),
    };
    (page_bytes >= PAGE_BYTES_MIN && page_bytes.is_power_of_two())
        .then_some((page_bytes, i32::from(header[20])))
}

/// SQLite's WAL checksum of `bytes` (a multiple of 8), chained from `(s1, s2)`.
fn wal_checksum((mut s1, mut s2): (u32, u32), bytes: &[u8], big_endian: bool) -> (u32, u32) {
    let word = |w: &[u8]| {
        let w = [w[0], w[1], w[2], w[3]];
        if big_endian {
            u32::from_be_bytes(w)
        } else {
            u32::from_le_bytes(w)
        }
    };
    for pair in bytes.chunks_exact(8) {
        s1 = s1.wrapping_add(word(&pair[..4])).wrapping_add(s2);
        s2 = s2.wrapping_add(word(&pair[4..])).wrapping_add(s1);
    }
    (s1, s2)
}

fn be_u32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

impl CheckedFile {
    /// The page number of a whole checked page at `offset` of `amount` bytes; `None` when the
    /// access is not one (or the file is not checked).
    fn checked_page(&self, amount: c_int, offset: i64) -> Option<u32> {
        let page_bytes = i64::from(self.page_bytes);
        let whole_page = self.main_db
            && self.reserved == i32::from(CHECKSUM_BYTES)
            && page_bytes > 0
            && i64::from(amount) == page_bytes
            && offset >= 0
            && offset % page_bytes == 0;
        whole_page
            .then(|| u32::try_from(offset / page_bytes + 1).ok())
            .flatten()
    }

    /// Takes the page size and reserve from bytes at offset 0 that hold the header.
    fn note_header(&mut self, bytes: &[u8], offset: i64) {
        if self.main_db && offset == 0 {
            if let Some((page_bytes, reserved)) = header_fields(bytes) {
                self.page_bytes = page_bytes;
                self.reserved = reserved;
            }
        }
        if self.wal && offset == 0 && bytes.len() >= WAL_HEADER_BYTES as usize {
            let magic = be_u32(&bytes[..4]);
            let page_bytes = be_u32(&bytes[8..12]);
            if magic & !1 == WAL_MAGIC && page_bytes.is_power_of_two() {
                self.big_endian_sums = magic & 1 == 1;
                self.page_bytes = page_bytes;
            }
        }
    }

    /// A WAL's frame geometry: the bytes of a frame, header and page; `None` before the WAL's
    /// header was seen.
    fn frame_bytes(&self) -> Option<i64> {
        (self.wal && self.page_bytes >= PAGE_BYTES_MIN)
            .then(|| i64::from(self.page_bytes) + WAL_FRAME_HEADER_BYTES as i64)
    }

    /// Whether the WAL's pages reserve the checksum: as the last page 1 it wrote says, else as
    /// its database file's header does.
    ///
    /// # Safety
    /// `self.database`, when not null, is the shim's open database file of this WAL.
    unsafe fn wal_pages_checked(&self) -> bool {
        let reserved = if self.reserved >= 0 || self.database.is_null() {
            self.reserved
        } else {
            (*self.database.cast::<CheckedFile>()).reserved
        };
        reserved == i32::from(CHECKSUM_BYTES)
    }
}

/// The shim's file and the underlying one behind `file`.
///
/// # Safety
/// `file` is a file this shim opened (its methods are [`METHODS`]).
unsafe fn parts<'a>(file: *mut ffi::sqlite3_file) -> (&'a mut CheckedFile, *mut ffi::sqlite3_file) {
    let checked = &mut *file.cast::<CheckedFile>();
    let real = checked.real;
    (checked, real)
}

/// The underlying file's methods.
///
/// # Safety
/// `real` is an open file of the underlying VFS.
unsafe fn real_methods<'a>(real: *mut ffi::sqlite3_file) -> &'a ffi::sqlite3_io_methods {
    &*(*real).pMethods
}

/// The underlying VFS behind the shim's.
///
/// # Safety
/// `vfs` is the shim's registered VFS.
unsafe fn real_vfs(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    (*vfs).pAppData.cast()
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};

// SAFETY (every `extern "C"` function below): SQLite calls them only as this shim's VFS and
// file methods, so `vfs` is the shim's registered VFS and `file` a file its `open` set up,
// whose underlying file was opened by the underlying VFS; buffers and out-pointers are
// SQLite's, valid for the sizes it passes, as its VFS interface guarantees.

unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let real_vfs = real_vfs(vfs);
    let real = file
        .cast::<u8>()
        .add(REAL_OFFSET)
        .cast::<ffi::sqlite3_file>();
    file.cast::<CheckedFile>().write(CheckedFile {
        base: ffi::sqlite3_file {
            pMethods: std::ptr::null(),
        },
        real,
        main_db: flags & ffi::SQLITE_OPEN_MAIN_DB != 0,
        page_bytes: 0,
        reserved: -1,
        wal: flags & ffi::SQLITE_OPEN_WAL != 0,
        database: std::ptr::null_mut(),
        big_endian_sums: false,
        pending_header: None,
    });
    let Some(real_open) = (*real_vfs).xOpen else {
        return ffi::SQLITE_CANTOPEN;
    };
    let rc = real_open(real_vfs, name, real, flags, out_flags);
    if rc != ffi::SQLITE_OK || (*real).pMethods.is_null() {
        // A file whose open failed has no methods, so SQLite does not close it.
        return rc;
    }
    // The methods below reach every field of a version 3 method table (the unix VFS's).
    if (*(*real).pMethods).iVersion < 3 {
        if let Some(real_close) = (*(*real).pMethods).xClose {
            real_close(real);
        }
        return ffi::SQLITE_CANTOPEN;
    }
    if flags & ffi::SQLITE_OPEN_WAL != 0 && !name.is_null() {
        // SQLite names a WAL by a pointer into its database's allocation, which finds the
        // database's file: the shim's (every file of the process goes through it).
        let database = ffi::sqlite3_database_file_object(name);
        if !database.is_null() && std::ptr::eq((*database).pMethods, &METHODS) {
            (*file.cast::<CheckedFile>()).database = database;
        }
    }
    (*file).pMethods = &METHODS;
    rc
}

/// Writes the WAL frame header held back, as SQLite made it; `SQLITE_OK` when none was.
///
/// # Safety
/// `checked` and `real` are the parts of one file of this shim.
unsafe fn flush_pending_header(checked: &mut CheckedFile, real: *mut ffi::sqlite3_file) -> c_int {
    let Some((offset, header)) = checked.pending_header.take() else {
        return ffi::SQLITE_OK;
    };
    match real_methods(real).xWrite {
        Some(real_write) => real_write(
            real,
            header.as_ptr().cast(),
            WAL_FRAME_HEADER_BYTES as c_int,
            offset,
        ),
        None => ffi::SQLITE_IOERR_WRITE,
    }
}

/// Reads `N` bytes of the underlying file at `offset`.
///
/// # Safety
/// `real` is an open file of the underlying VFS.
unsafe fn read_real<const N: usize>(
    real: *mut ffi::sqlite3_file,
    offset: i64,
) -> Result<[u8; N], c_int> {
    let mut out = [0u8; N];
    let Some(real_read) = real_methods(real).xRead else {
        return Err(ffi::SQLITE_IOERR_READ);
    };
    match real_read(real, out.as_mut_ptr().cast(), N as c_int, offset) {
        ffi::SQLITE_OK => Ok(out),
        rc => Err(rc),
    }
}

/// A write to a WAL file: a frame header is held until its page comes; a page gets its
/// checksum filled in and, with the header held for it, the frame's checksum computed again;
/// anything else passes through (after any header held).
///
/// # Safety
/// `checked` and `real` are the parts of one WAL file of this shim; `bytes` is SQLite's buffer.
unsafe fn write_wal(
    checked: &mut CheckedFile,
    real: *mut ffi::sqlite3_file,
    bytes: &[u8],
    offset: i64,
) -> c_int {
    let Some(real_write) = real_methods(real).xWrite else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    // Bytes that are neither a frame header nor a page (the WAL's header), or any before the
    // WAL's header told its geometry: written as they come, after any header held.
    let write_through = |checked: &mut CheckedFile| {
        let rc = flush_pending_header(checked, real);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        checked.note_header(bytes, offset);
        real_write(real, bytes.as_ptr().cast(), bytes.len() as c_int, offset)
    };
    let Some(frame_bytes) = checked.frame_bytes() else {
        return write_through(checked);
    };
    let in_frames = offset - WAL_HEADER_BYTES;
    let page_bytes = frame_bytes - WAL_FRAME_HEADER_BYTES as i64;
    if bytes.len() == WAL_FRAME_HEADER_BYTES && in_frames >= 0 && in_frames % frame_bytes == 0 {
        let rc = flush_pending_header(checked, real);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        let mut header = [0u8; WAL_FRAME_HEADER_BYTES];
        header.copy_from_slice(bytes);
        checked.pending_header = Some((offset, header));
        return ffi::SQLITE_OK;
    }
    let page_at = in_frames - WAL_FRAME_HEADER_BYTES as i64;
    let whole_page = bytes.len() as i64 == page_bytes && page_at >= 0 && page_at % frame_bytes == 0;
    if !whole_page {
        return write_through(checked);
    }
    let header_at = offset - WAL_FRAME_HEADER_BYTES as i64;
    let held = match checked.pending_header {
        Some((at, header)) if at == header_at => {
            checked.pending_header = None;
            Some(header)
        }
        _ => {
            let rc = flush_pending_header(checked, real);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            None
        }
    };
    // The frame: its header (held, or as the file has it) and the page, one buffer.
    let mut frame = vec![0u8; WAL_FRAME_HEADER_BYTES + bytes.len()];
    match held {
        Some(header) => frame[..WAL_FRAME_HEADER_BYTES].copy_from_slice(&header),
        None => match read_real::<WAL_FRAME_HEADER_BYTES>(real, header_at) {
            Ok(header) => frame[..WAL_FRAME_HEADER_BYTES].copy_from_slice(&header),
            Err(rc) => return rc,
        },
    }
    frame[WAL_FRAME_HEADER_BYTES..].copy_from_slice(bytes);
    let page_no = be_u32(&frame[..4]);
    let (header, page) = frame.split_at_mut(WAL_FRAME_HEADER_BYTES);
    if page_no == 1 {
        if let Some((_, reserved)) = header_fields(page) {
            checked.reserved = reserved;
        }
    }
    if checked.wal_pages_checked() {
        let at = page.len() - usize::from(CHECKSUM_BYTES);
        let checksum = page_checksum(&page[..at], page_no);
        page[at..].copy_from_slice(&checksum);
    }
    let Some(held) = held else {
        // A page written again within its transaction, without its header: SQLite computes
        // the checksums of the transaction's frames again from the file at commit.
        return real_write(real, page.as_ptr().cast(), page.len() as c_int, offset);
    };
    if held[8..].iter().all(|&b| b == 0) {
        // A header whose salts and checksums SQLite fills in at commit, as above.
        return real_write(real, frame.as_ptr().cast(), frame.len() as c_int, header_at);
    }
    // The frame's checksum, chained from the one before it as the file holds it.
    let previous_at = if header_at == WAL_HEADER_BYTES {
        24
    } else {
        header_at - frame_bytes + 16
    };
    let previous = match read_real::<8>(real, previous_at) {
        Ok(sums) => (be_u32(&sums[..4]), be_u32(&sums[4..])),
        Err(rc) => return rc,
    };
    let sums = wal_checksum(previous, &header[..8], checked.big_endian_sums);
    let (s1, s2) = wal_checksum(sums, page, checked.big_endian_sums);
    header[16..20].copy_from_slice(&s1.to_be_bytes());
    header[20..24].copy_from_slice(&s2.to_be_bytes());
    real_write(real, frame.as_ptr().cast(), frame.len() as c_int, header_at)
}

unsafe extern "C" fn read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    let (checked, real) = parts(file);
    let Some(real_read) = real_methods(real).xRead else {
        return ffi::SQLITE_IOERR_READ;
    };
    let rc = flush_pending_header(checked, real);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    let rc = real_read(real, buf, amount, offset);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    let Ok(len) = usize::try_from(amount) else {
        return rc;
    };
    let bytes = std::slice::from_raw_parts(buf.cast::<u8>(), len);
    checked.note_header(bytes, offset);
    if let Some(page_no) = checked.checked_page(amount, offset) {
        let (data, stored) = bytes.split_at(len - usize::from(CHECKSUM_BYTES));
        if page_checksum(data, page_no) != stored {
            log::error!(
                "catalog page {page_no} fails its checksum: the file is damaged; restore the \
                 catalog from a backup (pico admin restore)"
            );
            return ffi::SQLITE_IOERR_DATA;
        }
    }
    rc
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    let (checked, real) = parts(file);
    let Some(real_write) = real_methods(real).xWrite else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    let Ok(len) = usize::try_from(amount) else {
        return real_write(real, buf, amount, offset);
    };
    let bytes = std::slice::from_raw_parts(buf.cast::<u8>(), len);
    if checked.wal {
        return write_wal(checked, real, bytes, offset);
    }
    checked.note_header(bytes, offset);
    match checked.checked_page(amount, offset) {
        Some(page_no) => {
            // A copy: the page is SQLite's, passed as read-only.
            let mut page = bytes.to_vec();
            let at = len - usize::from(CHECKSUM_BYTES);
            let checksum = page_checksum(&page[..at], page_no);
            page[at..].copy_from_slice(&checksum);
            real_write(real, page.as_ptr().cast(), amount, offset)
        }
        None => real_write(real, buf, amount, offset),
    }
}

unsafe extern "C" fn fetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    amount: c_int,
    out: *mut *mut c_void,
) -> c_int {
    let (checked, real) = parts(file);
    // A main database's pages are read through `read`, never mapped unchecked.
    match real_methods(real).xFetch {
        Some(real_fetch) if !checked.main_db => real_fetch(real, offset, amount, out),
        _ => {
            *out = std::ptr::null_mut();
            ffi::SQLITE_OK
        }
    }
}

unsafe extern "C" fn unfetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    page: *mut c_void,
) -> c_int {
    let (_, real) = parts(file);
    match real_methods(real).xUnfetch {
        Some(real_unfetch) => real_unfetch(real, offset, page),
        None => ffi::SQLITE_OK,
    }
}

unsafe extern "C" fn file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    let (checked, real) = parts(file);
    if op == FCNTL_RESERVED_BYTES {
        *arg.cast::<c_int>() = checked.reserved;
        return ffi::SQLITE_OK;
    }
    match real_methods(real).xFileControl {
        Some(real_control) => real_control(real, op, arg),
        None => ffi::SQLITE_NOTFOUND,
    }
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    let (checked, real) = parts(file);
    let flushed = flush_pending_header(checked, real);
    let rc = match real_methods(real).xClose {
        Some(real_close) => real_close(real),
        None => ffi::SQLITE_OK,
    };
    (*file).pMethods = std::ptr::null();
    if flushed != ffi::SQLITE_OK {
        return flushed;
    }
    rc
}

/// Methods that only pass the call on to the underlying file.
macro_rules! pass_through {
    ($name:ident, $method:ident, $missing:expr $(, $arg:ident: $ty:ty)*) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> c_int {
            let (_, real) = parts(file);
            match real_methods(real).$method {
                Some(method) => method(real $(, $arg)*),
                None => $missing,
            }
        }
    };
}

/// Methods that pass the call on to the underlying file after writing a WAL frame header held
/// back, so the file is whole before it is cut, synced or measured.
macro_rules! after_pending_header {
    ($name:ident, $method:ident, $missing:expr $(, $arg:ident: $ty:ty)*) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> c_int {
            let (checked, real) = parts(file);
            let rc = flush_pending_header(checked, real);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            match real_methods(real).$method {
                Some(method) => method(real $(, $arg)*),
                None => $missing,
            }
        }
    };
}

after_pending_header!(truncate, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, size: ffi::sqlite3_int64);
after_pending_header!(sync, xSync, ffi::SQLITE_IOERR_FSYNC, flags: c_int);
after_pending_header!(file_size, xFileSize, ffi::SQLITE_IOERR_FSTAT, size: *mut ffi::sqlite3_int64);
pass_through!(lock, xLock, ffi::SQLITE_IOERR_LOCK, level: c_int);
pass_through!(unlock, xUnlock, ffi::SQLITE_IOERR_UNLOCK, level: c_int);
pass_through!(check_reserved_lock, xCheckReservedLock, ffi::SQLITE_IOERR_CHECKRESERVEDLOCK, out: *mut c_int);
pass_through!(sector_size, xSectorSize, 4096);
pass_through!(device_characteristics, xDeviceCharacteristics, 0);
pass_through!(shm_map, xShmMap, ffi::SQLITE_IOERR_SHMMAP, region: c_int, size: c_int, extend: c_int, out: *mut *mut c_void);
pass_through!(shm_lock, xShmLock, ffi::SQLITE_IOERR_SHMLOCK, offset: c_int, n: c_int, flags: c_int);
pass_through!(shm_unmap, xShmUnmap, ffi::SQLITE_OK, delete: c_int);

unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    let (_, real) = parts(file);
    if let Some(barrier) = real_methods(real).xShmBarrier {
        barrier(real);
    }
}

/// VFS methods that only pass the call on to the underlying VFS.
macro_rules! vfs_pass_through {
    ($name:ident, $method:ident, $ret:ty, $missing:expr $(, $arg:ident: $ty:ty)*) => {
        unsafe extern "C" fn $name(vfs: *mut ffi::sqlite3_vfs $(, $arg: $ty)*) -> $ret {
            let real = real_vfs(vfs);
            match (*real).$method {
                Some(method) => method(real $(, $arg)*),
                None => $missing,
            }
        }
    };
}

vfs_pass_through!(delete, xDelete, c_int, ffi::SQLITE_IOERR_DELETE, name: *const c_char, sync_dir: c_int);
vfs_pass_through!(access, xAccess, c_int, ffi::SQLITE_IOERR_ACCESS, name: *const c_char, flags: c_int, out: *mut c_int);
vfs_pass_through!(full_pathname, xFullPathname, c_int, ffi::SQLITE_CANTOPEN, name: *const c_char, out_bytes: c_int, out: *mut c_char);
vfs_pass_through!(randomness, xRandomness, c_int, 0, bytes: c_int, out: *mut c_char);
vfs_pass_through!(sleep, xSleep, c_int, 0, microseconds: c_int);
vfs_pass_through!(current_time, xCurrentTime, c_int, ffi::SQLITE_ERROR, out: *mut f64);
vfs_pass_through!(get_last_error, xGetLastError, c_int, 0, bytes: c_int, out: *mut c_char);
vfs_pass_through!(current_time_int64, xCurrentTimeInt64, c_int, ffi::SQLITE_ERROR, out: *mut ffi::sqlite3_int64);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::Sqlite;

    /// Byte 20 of the file's header: the bytes each page reserves.
    fn reserve_in_file(path: &std::path::Path) -> u8 {
        std::fs::read(path).unwrap()[20]
    }

    fn flip(path: &std::path::Path, at: usize) {
        let mut bytes = std::fs::read(path).unwrap();
        bytes[at] ^= 0x04;
        std::fs::write(path, bytes).unwrap();
    }

    /// A byte of page 1's cell area (the schema's rows, read by every open), off its end.
    fn in_page_one(path: &std::path::Path) -> usize {
        let bytes = std::fs::read(path).unwrap();
        let (page_bytes, _) = header_fields(&bytes).unwrap();
        page_bytes as usize - usize::from(CHECKSUM_BYTES) - 40
    }

    #[test]
    fn a_flipped_bit_in_a_catalog_page_is_refused_when_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        drop(Sqlite::open(&path).unwrap());
        assert_eq!(reserve_in_file(&path), CHECKSUM_BYTES);
        drop(Sqlite::open(&path).expect("an intact catalog opens again"));
        flip(&path, in_page_one(&path));
        let Err(error) = Sqlite::open(&path) else {
            panic!("a damaged page was read as a catalog");
        };
        assert!(error.to_string().contains("fails its checksum"), "{error}");
    }

    fn copy_catalog(from: &std::path::Path, to: &std::path::Path) {
        for suffix in ["", "-wal"] {
            let name = |p: &std::path::Path| format!("{}{suffix}", p.display());
            std::fs::copy(name(from), name(to)).unwrap();
        }
    }

    /// A node killed with rows in its catalog's WAL, then the catalog opened by another SQLite
    /// program (one without this shim: the `sqlite3` shell, a script) that reads it and closes
    /// it last, so it checkpoints the WAL into the file: the pages it copies carry their
    /// checksums, the frames their valid checksums (it recovered every row), and the node
    /// opens the catalog again.
    #[test]
    fn another_sqlite_program_that_checkpoints_the_wal_keeps_the_pages_checked() {
        let dir = tempfile::tempdir().unwrap();
        let (path, copy) = (dir.path().join("meta.db"), dir.path().join("copy.db"));
        let rows: i64 = 600;
        {
            let db = Sqlite::open(&path).unwrap();
            db.conn
                .execute_batch(
                    "PRAGMA wal_autocheckpoint = 0; CREATE TABLE t (n INTEGER, pad TEXT)",
                )
                .unwrap();
            for n in 0..rows {
                // One transaction each, some pages written again and again.
                db.conn
                    .execute("INSERT INTO t VALUES (?1, ?2)", (n, "x".repeat(200)))
                    .unwrap();
            }
            db.conn
                .execute("UPDATE t SET pad = 'y' WHERE n % 7 = 0", [])
                .unwrap();
            // One transaction larger than the page cache: SQLite spills pages to the WAL
            // before the commit, writes some of them again in place, and computes the
            // transaction's frame checksums again from the file at its commit.
            db.conn
                .execute_batch(
                    "PRAGMA cache_size = 4; BEGIN; \
                     CREATE TABLE big (n INTEGER PRIMARY KEY, pad TEXT); \
                     WITH RECURSIVE s(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s \
                       WHERE n < 1999) INSERT INTO big SELECT n, hex(randomblob(150)) FROM s; \
                     UPDATE big SET pad = 'z' || pad WHERE n % 3 = 0; COMMIT",
                )
                .unwrap();
            // The process dies here: the file and its WAL as they are.
            copy_catalog(&path, &copy);
        }
        let wal_bytes = std::fs::metadata(format!("{}-wal", copy.display()))
            .unwrap()
            .len();
        assert!(
            wal_bytes > 100_000,
            "the rows are in the WAL: {wal_bytes} bytes"
        );
        {
            let flags = rusqlite::OpenFlags::default();
            let other = Connection::open_with_flags_and_vfs(&copy, flags, c"unix").unwrap();
            let (count, sevens): (i64, i64) = other
                .query_row("SELECT count(*), sum(pad = 'y') FROM t", [], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
                .unwrap();
            assert_eq!(
                (count, sevens),
                (rows, (rows + 6) / 7),
                "it recovered every frame"
            );
            let (big, zs): (i64, i64) = other
                .query_row("SELECT count(*), sum(pad LIKE 'z%') FROM big", [], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
                .unwrap();
            assert_eq!(
                (big, zs),
                (2000, 667),
                "and the transaction larger than the cache"
            );
            other
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .unwrap();
        }
        let bytes = std::fs::read(&copy).unwrap();
        let (page_bytes, reserved) = header_fields(&bytes).unwrap();
        assert_eq!(reserved, i32::from(CHECKSUM_BYTES));
        for (i, page) in bytes.chunks(page_bytes as usize).enumerate() {
            let (data, stored) = page.split_at(page.len() - usize::from(CHECKSUM_BYTES));
            assert_eq!(page_checksum(data, i as u32 + 1), stored, "page {}", i + 1);
        }
        let db = Sqlite::open(&copy).expect("the node opens what the other program left");
        let count: i64 = db
            .conn
            .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
            .unwrap();
        assert_eq!(count, rows);
    }

    #[test]
    fn a_catalog_made_without_checksums_gets_them_once_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        let id: String = {
            // Made as a build before the checksums made it: through the plain VFS.
            let flags = rusqlite::OpenFlags::default();
            let mut conn = Connection::open_with_flags_and_vfs(&path, flags, c"unix").unwrap();
            crate::schema::configure(&conn, false).unwrap();
            crate::schema::migrate(&mut conn).unwrap();
            conn.query_row("SELECT id FROM catalog_identity", [], |row| row.get(0))
                .unwrap()
        };
        assert_eq!(reserve_in_file(&path), 0);
        {
            let db = Sqlite::open(&path).unwrap();
            let kept: String = db
                .conn
                .query_row("SELECT id FROM catalog_identity", [], |row| row.get(0))
                .unwrap();
            assert_eq!(kept, id);
        }
        assert_eq!(reserve_in_file(&path), CHECKSUM_BYTES);
        flip(&path, in_page_one(&path));
        assert!(Sqlite::open(&path).is_err());
    }

    #[test]
    fn a_header_names_its_page_size_and_reserve() {
        let mut header = [0u8; HEADER_BYTES];
        header[..16].copy_from_slice(b"SQLite format 3\0");
        header[16..18].copy_from_slice(&4096u16.to_be_bytes());
        header[20] = 8;
        assert_eq!(header_fields(&header), Some((4096, 8)));
        header[16..18].copy_from_slice(&1u16.to_be_bytes());
        assert_eq!(header_fields(&header), Some((65_536, 8)));
        header[16..18].copy_from_slice(&1000u16.to_be_bytes());
        assert_eq!(header_fields(&header), None);
        assert_eq!(header_fields(&header[..50]), None);
    }

    #[test]
    fn a_checksum_covers_the_bytes_and_the_place() {
        let page = vec![7u8; 4088];
        let sum = page_checksum(&page, 3);
        assert_ne!(
            sum,
            page_checksum(&page, 4),
            "the same bytes at another page"
        );
        let mut flipped = page.clone();
        flipped[100] ^= 0x10;
        assert_ne!(sum, page_checksum(&flipped, 3));
    }
}

//! Atomic file replacement: temp file in the same folder, fsync, rename, fsync the folder.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Marker inside temp file names; files with it are left-overs of a crash and are removed at open.
pub(crate) const TMP_MARKER: &str = ".tmp-";

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `dir/file_name` atomically without syncing the folder (call [`sync_dir`]
/// after a group of writes). The temp file is `.<file_name>.tmp-<pid>-<n>` (hidden, never `*.conf`)
/// and keeps the permissions of the file it replaces.
pub(crate) fn write_atomic_nosync_dir(dir: &Path, file_name: &str, bytes: &[u8]) -> io::Result<()> {
    let target = dir.join(file_name);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(
        ".{file_name}{TMP_MARKER}{}-{n}",
        std::process::id()
    ));
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        if let Ok(meta) = fs::metadata(&target) {
            f.set_permissions(fs::Permissions::from_mode(
                meta.permissions().mode() & 0o7777,
            ))?;
        }
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, &target)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Makes renames and removals in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Removes a file; a file that is already gone is fine.
pub(crate) fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Reads a file; `None` when it does not exist.
pub(crate) fn read_optional(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

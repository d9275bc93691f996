//! Atomic file replacement: temp file in the same folder, fsync, rename, fsync the folder.
//!
//! For many files at once, fsyncing each temp file costs one disk flush per file (about 2 ms
//! each here: 1,000 files = 2 s per step). Above [`BULK_THRESHOLD`] files the temp files are
//! written unsynced and made durable with one `syncfs` of their filesystem before any rename, which
//! keeps the same guarantee (no rename becomes visible before its data is on disk).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Marker of temp file names: `.<file name>.tmp-<pid>-<n>`. Temp files are recognised by this
/// whole suffix ([`is_temp_name`]), never by the marker alone: an upstream name may contain
/// `.tmp-` (`svc.tmp-1`), and its journal must not be taken for a temp file.
pub(crate) const TMP_MARKER: &str = ".tmp-";

/// Up to this many files, each temp file is fsynced on its own; above, one `syncfs` covers all.
pub(crate) const BULK_THRESHOLD: usize = 8;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Whether `file_name` is a temp file of [`write_many`]: a leading `.`, then anything, then
/// `.tmp-<digits>-<digits>` at the very end.
pub(crate) fn is_temp_name(file_name: &str) -> bool {
    let Some(body) = file_name.strip_prefix('.') else {
        return false;
    };
    let Some((head, tail)) = body.rsplit_once(TMP_MARKER) else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    !head.is_empty()
        && tail
            .split_once('-')
            .is_some_and(|(a, b)| digits(a) && digits(b))
}

/// One file for [`write_many`]: its name in the folder, its bytes, and the file whose permissions
/// it takes (itself when it exists; a journal takes those of the upstream file it saves, so that
/// renaming it back restores the permissions too).
pub(crate) struct Item<'a> {
    pub name: String,
    pub bytes: &'a [u8],
    pub mode_of: String,
}

impl<'a> Item<'a> {
    pub fn new(name: String, bytes: &'a [u8]) -> Item<'a> {
        Item {
            mode_of: name.clone(),
            name,
            bytes,
        }
    }
}

/// Writes `bytes` to a new temp file `.<file_name>.tmp-<pid>-<n>` in `dir` (hidden, never
/// `*.conf`), with the permissions of `dir/<mode_of>` when it exists; fsynced when `sync`.
fn write_temp(
    dir: &Path,
    file_name: &str,
    mode_of: &str,
    bytes: &[u8],
    sync: bool,
) -> io::Result<PathBuf> {
    let target = dir.join(mode_of);
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
        if sync {
            f.sync_all()?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Replaces each `dir/<name>` with its bytes, atomically per file, without syncing the folder
/// (call [`sync_dir`] after). On an error returns the index of the failing item; items before it
/// may already be replaced, none after it is.
pub(crate) fn write_many(dir: &Path, items: &[Item<'_>]) -> Result<(), (usize, io::Error)> {
    let temps = write_temps(dir, items)?;
    rename_temps(dir, items, &temps)
}

/// The first half of [`write_many`]: each item's bytes in a temp file of `dir`, durable (each
/// fsynced, or above [`BULK_THRESHOLD`] one `syncfs`), nothing renamed yet. On an error the temp
/// files are gone and the index of the failing item is returned.
pub(crate) fn write_temps(
    dir: &Path,
    items: &[Item<'_>],
) -> Result<Vec<PathBuf>, (usize, io::Error)> {
    let bulk = items.len() > BULK_THRESHOLD;
    let mut temps: Vec<PathBuf> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match write_temp(dir, &item.name, &item.mode_of, item.bytes, !bulk) {
            Ok(t) => temps.push(t),
            Err(e) => {
                remove_temps(&temps);
                return Err((i, e));
            }
        }
    }
    if bulk {
        if let Err(e) = sync_fs(dir) {
            remove_temps(&temps);
            return Err((0, e));
        }
    }
    Ok(temps)
}

/// The second half of [`write_many`]: renames each temp file over its item's name, in order. On
/// an error the temp files not renamed are removed and the index of the failing item returned.
pub(crate) fn rename_temps(
    dir: &Path,
    items: &[Item<'_>],
    temps: &[PathBuf],
) -> Result<(), (usize, io::Error)> {
    for (i, (item, tmp)) in items.iter().zip(temps).enumerate() {
        if let Err(e) = fs::rename(tmp, dir.join(&item.name)) {
            remove_temps(&temps[i..]);
            return Err((i, e));
        }
    }
    Ok(())
}

/// Removes temp files (best effort: recovery removes any left at the next open).
pub(crate) fn remove_temps(temps: &[PathBuf]) {
    for t in temps {
        let _ = fs::remove_file(t);
    }
}

/// Makes `dir/<dest>` another name of the file `dir/<src>` (a hard link), replacing `dest`
/// atomically (linked under a temp name, then renamed over it); the folder is not synced. No byte
/// is copied, so only the folder needs an fsync to make it durable.
pub(crate) fn link_replace(dir: &Path, src: &str, dest: &str) -> io::Result<()> {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{dest}{TMP_MARKER}{}-{n}", std::process::id()));
    fs::hard_link(dir.join(src), &tmp)?;
    fs::rename(&tmp, dir.join(dest)).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// Flushes the filesystem holding `dir` (`syncfs`).
fn sync_fs(dir: &Path) -> io::Result<()> {
    let d = File::open(dir)?;
    rustix::fs::syncfs(&d).map_err(io::Error::from)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_are_recognised_by_their_whole_suffix() {
        assert!(is_temp_name(".api.conf.tmp-12-3"));
        assert!(is_temp_name(".svc.tmp-1.conf.prev.tmp-99-0"));
        // Journals and files of upstreams whose name holds ".tmp-" are not temp files.
        assert!(!is_temp_name(".svc.tmp-1.conf.prev"));
        assert!(!is_temp_name(".svc.tmp-1.conf.none"));
        assert!(!is_temp_name(".svc.tmp-1-2.conf.prev"));
        assert!(!is_temp_name("svc.tmp-1-2"));
        assert!(!is_temp_name(".tmp-1-2"));
        assert!(!is_temp_name(".api.conf.tmp-1-"));
        assert!(!is_temp_name(".api.conf.tmp-x-1"));
    }
}

//! [`TmpfsMount`]: a small tmpfs over a folder, for the tests of a full or immutable disk.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A small tmpfs mounted over a folder (for full-disk tests); unmounted on drop (lazily if still
/// busy). Needs root (or CAP_SYS_ADMIN).
#[derive(Debug)]
pub struct TmpfsMount {
    dir: PathBuf,
}

impl TmpfsMount {
    /// Mounts a tmpfs of `size_bytes` on `dir` (which must exist; what it held is hidden until
    /// unmount). The error says why when the kernel refuses (not root, in a container...).
    pub fn mount(dir: &Path, size_bytes: u64) -> Result<TmpfsMount, String> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size_bytes},mode=0755"))
            .arg("tributary-test")
            .arg(dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs on {} failed: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(TmpfsMount {
            dir: dir.to_path_buf(),
        })
    }

    /// The mount point.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes the mount's top folder immutable (`chattr +i`: no file in it can be created,
    /// renamed or removed, even by root) or mutable again. Open files stay writable.
    pub fn set_immutable(&self, on: bool) -> Result<(), String> {
        let flag = if on { "+i" } else { "-i" };
        let out = Command::new("chattr")
            .arg(flag)
            .arg(&self.dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running chattr (Debian package e2fsprogs): {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "chattr {flag} {} failed: {}",
                self.dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Writes a filler file in the mount until the file system is full (`ENOSPC`); returns
    /// its path.
    pub fn fill(&self, file_name: &str) -> PathBuf {
        let path = self.dir.join(file_name);
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        let block = vec![0u8; 4096];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        // Smaller writes take the last partial page.
        for _ in 0..4096 {
            if f.write(&[0u8]).is_err() {
                break;
            }
        }
        path
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let _ = self.set_immutable(false);
        let ok = Command::new("umount")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

//! Crash recovery at [`Applier::open`]: journals left by a change in flight are tested and the
//! change made live, or restored.

use std::collections::HashMap;
use std::fs;

use tributary_core::UpstreamName;

use super::{io_err, join_errors, Applier, ApplyError, Pending, RecoveryReport, LOCK_FILE};
use super::{JOURNAL_NONE, JOURNAL_PREV};
use crate::fsutil::{is_temp_name, remove_if_exists};

impl Applier {
    pub(super) fn recover(&mut self) -> Result<(), ApplyError> {
        let dir = self.upstreams.clone();
        let mut pending: Vec<Pending> = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let entry = entry.map_err(io_err(&dir))?;
            let fname = entry.file_name().to_string_lossy().into_owned();
            if !fname.starts_with('.') || fname == LOCK_FILE {
                continue;
            }
            if is_temp_name(&fname) {
                remove_if_exists(&entry.path()).map_err(io_err(&entry.path()))?;
                continue;
            }
            let Some((name, is_prev)) = journal_name(&fname) else {
                continue;
            };
            let previous = if is_prev {
                Some(fs::read(entry.path()).map_err(io_err(&entry.path()))?)
            } else {
                None
            };
            // `.prev` wins over `.none` if both exist (a crash while switching kinds).
            if let Some(existing) = pending.iter_mut().find(|p| p.name == name) {
                if previous.is_some() {
                    existing.previous = previous;
                }
                continue;
            }
            pending.push(Pending {
                name,
                previous,
                new: None,
            });
        }
        if pending.is_empty() {
            return Ok(());
        }
        pending.sort_by(|a, b| a.name.cmp(&b.name));
        let mut report = RecoveryReport {
            pending: pending.iter().map(|p| p.name.clone()).collect(),
            ..RecoveryReport::default()
        };
        let restore = match self.nginx.test() {
            Ok(()) => {
                // What is on disk is valid: make it live.
                match self.reload_confirmed() {
                    Ok(()) => {
                        report.reload = Some(Ok(()));
                        self.settle(&pending);
                        false
                    }
                    Err(e) => {
                        report.reload = Some(Err(e.to_string()));
                        true
                    }
                }
            }
            Err(e) => {
                report.test_error = Some(e.output().to_string());
                true
            }
        };
        if restore {
            match self.unstage(&pending) {
                Ok(()) => report.restored = true,
                Err(u) => report.restore_error = Some(join_errors(&u)),
            }
            if let Err(e2) = self.nginx.test() {
                report.still_failing = Some(e2.output().to_string());
            }
        }
        self.recovery = report;
        Ok(())
    }

    /// Every `<name>.conf` in the folder with its bytes.
    pub(super) fn files_on_disk(
        &self,
    ) -> Result<HashMap<UpstreamName, Option<Vec<u8>>>, ApplyError> {
        let dir = &self.upstreams;
        let mut out = HashMap::new();
        for entry in fs::read_dir(dir).map_err(io_err(dir))? {
            let entry = entry.map_err(io_err(dir))?;
            let fname = entry.file_name().to_string_lossy().into_owned();
            let Some(name) = fname
                .strip_suffix(".conf")
                .and_then(|n| UpstreamName::parse(n).ok())
            else {
                continue;
            };
            if let Ok(bytes) = fs::read(entry.path()) {
                out.insert(name, Some(bytes));
            }
        }
        Ok(out)
    }
}

/// The upstream name of a journal file and whether it is a `.prev` (else `.none`) journal. Any
/// valid upstream name is recognised, also one containing `.tmp-` or `.conf`.
pub(super) fn journal_name(file_name: &str) -> Option<(UpstreamName, bool)> {
    let stem = file_name.strip_prefix('.')?;
    let (name, is_prev) = if let Some(n) = stem.strip_suffix(JOURNAL_PREV) {
        (n, true)
    } else {
        (stem.strip_suffix(JOURNAL_NONE)?, false)
    };
    UpstreamName::parse(name).ok().map(|n| (n, is_prev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journals_are_recognised_for_every_valid_name() {
        for n in [
            "svc",
            "svc.tmp-1",
            "svc.tmp-1-2",
            "a.conf",
            "x.conf.prev",
            "a_b-c.d",
        ] {
            let name = UpstreamName::parse(n).unwrap();
            let prev = format!(".{n}{JOURNAL_PREV}");
            let none = format!(".{n}{JOURNAL_NONE}");
            assert_eq!(journal_name(&prev), Some((name.clone(), true)), "{prev}");
            assert_eq!(journal_name(&none), Some((name, false)), "{none}");
            assert!(!is_temp_name(&prev) && !is_temp_name(&none), "{n}");
        }
        assert_eq!(journal_name(".tributary.lock"), None);
        assert_eq!(journal_name("svc.conf"), None);
        assert_eq!(journal_name("..conf.prev"), None);
    }
}

//! The error-log check [`crate::Nginx`] runs when it stops: lines with a marker of
//! [`LOG_MARKERS`] fail the test unless it declared them (`expect_log`: a line containing one of
//! the needles is expected). `[error]` counts: a proxied request, a reload or a peer that went
//! wrong; a test that makes a backend fail on purpose names the line it causes.

/// Markers of error-log lines that fail a test unless it declared them.
pub const LOG_MARKERS: [&str; 5] = [
    "[alert]",
    "[crit]",
    "[emerg]",
    "[error]",
    "exited on signal",
];

/// Error-log lines with a [`LOG_MARKERS`] marker that contain none of `expected`.
pub fn unexpected_log_lines(log: &str, expected: &[String]) -> Vec<String> {
    lines_with_markers(&LOG_MARKERS, log, expected)
}

/// Error-log lines with one of `markers` that contain none of `expected`.
pub fn lines_with_markers(markers: &[&str], log: &str, expected: &[String]) -> Vec<String> {
    log.lines()
        .filter(|l| markers.iter().any(|m| l.contains(m)))
        .filter(|l| !expected.iter().any(|e| l.contains(e.as_str())))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "2026/01/01 [notice] 1#1: start worker process 7\n\
                       2026/01/01 [alert] 1#1: worker process 7 exited on signal 11\n\
                       2026/01/01 [crit] 7#7: *1 open() failed\n\
                       2026/01/01 [emerg] 1#1: bind() failed\n\
                       2026/01/01 [error] 7#7: *2 connect() failed\n\
                       2026/01/01 [notice] 1#1: worker process 8 exited on signal 9\n";

    #[test]
    fn unexpected_lines_are_bad_markers_not_declared() {
        let all = unexpected_log_lines(LOG, &[]);
        assert_eq!(all.len(), 5, "{all:?}");
        assert!(all[0].contains("exited on signal 11"));
        assert!(all[4].contains("exited on signal 9"));
        let left = unexpected_log_lines(LOG, &["bind() failed".into(), "open()".into()]);
        assert_eq!(left.len(), 3, "{left:?}");
        assert!(left[1].contains("[error]"), "{left:?}");
    }

    #[test]
    fn error_lines_fail_unless_declared() {
        let all = lines_with_markers(&LOG_MARKERS, LOG, &[]);
        assert_eq!(all.len(), 5, "{all:?}");
        assert!(all[3].contains("[error]"), "{all:?}");
        let left = lines_with_markers(&LOG_MARKERS, LOG, &["connect() failed".into()]);
        assert_eq!(left.len(), 4, "{left:?}");
        assert!(left.iter().all(|l| !l.contains("[error]")), "{left:?}");
    }
}

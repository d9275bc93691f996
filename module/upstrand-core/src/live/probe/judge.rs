//! How a probe's answer is judged: the status line, the expected status and body text
//! ([`judge_answer`]), and why a probe failed ([`Failure`], kept in the zone as codes).

use super::ProbeConf;

/// Why a probe failed (kept in the zone as a code and an errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Failure {
    /// No answer within `timeout`.
    Timeout = 1,
    /// The connection could not be made (errno).
    Connect = 2,
    /// A status outside the range.
    Status = 3,
    /// The body lacked the substring.
    BodyMismatch = 4,
    /// The connection closed before a status line.
    NoAnswer = 5,
    /// Not an HTTP status line.
    BadAnswer = 6,
    /// Sending or reading failed (errno).
    Io = 7,
    /// The worker could not start the probe (no memory or connections).
    NoResources = 8,
}

impl Failure {
    /// From the code kept in the zone (0 and unknown codes: none).
    pub fn from_code(code: u32) -> Option<Failure> {
        use Failure::*;
        [
            Timeout,
            Connect,
            Status,
            BodyMismatch,
            NoAnswer,
            BadAnswer,
            Io,
            NoResources,
        ]
        .into_iter()
        .find(|f| *f as u32 == code)
    }

    /// The text of `last_error` (`errno` for `Connect`/`Io`, `status` for `Status`).
    pub fn text(self, errno: i32, status: u16) -> String {
        match self {
            Failure::Timeout => "timeout".into(),
            Failure::Connect => format!("connect: {}", errno_text(errno)),
            Failure::Status => format!("status {status}"),
            Failure::BodyMismatch => "body mismatch".into(),
            Failure::NoAnswer => "closed without an answer".into(),
            Failure::BadAnswer => "not an HTTP answer".into(),
            Failure::Io => format!("io: {}", errno_text(errno)),
            Failure::NoResources => "probe not started: no memory or connections".into(),
        }
    }
}

/// Short lower-case texts of the errors a connect or read commonly ends with (Linux numbers).
fn errno_text(errno: i32) -> String {
    match errno {
        111 => "connection refused".into(),
        110 => "timed out".into(),
        113 => "no route to host".into(),
        101 => "network unreachable".into(),
        104 => "connection reset".into(),
        32 => "broken pipe".into(),
        99 => "cannot assign requested address".into(),
        0 => "failed".into(),
        n => format!("error {n}"),
    }
}

/// The result of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Passed (the status, for HTTP).
    Pass { status: u16 },
    /// Failed: why, the errno (or 0) and the status when one came.
    Fail {
        why: Failure,
        errno: i32,
        status: u16,
    },
}

/// Judges an HTTP probe's answer from the bytes read so far. `complete`: the peer closed the
/// connection or [`BODY_WINDOW`] bytes were read (no more will come). None: read more.
pub fn judge_answer(conf: &ProbeConf, data: &[u8], complete: bool) -> Option<Outcome> {
    let line_end = data.iter().position(|&b| b == b'\n');
    let Some(end) = line_end else {
        return complete.then_some(Outcome::Fail {
            why: if data.is_empty() {
                Failure::NoAnswer
            } else {
                Failure::BadAnswer
            },
            errno: 0,
            status: 0,
        });
    };
    let Some(status) = judge_status_line(data.get(..end).unwrap_or_default()) else {
        return Some(Outcome::Fail {
            why: Failure::BadAnswer,
            errno: 0,
            status: 0,
        });
    };
    if status < conf.status.0 || status > conf.status.1 {
        return Some(Outcome::Fail {
            why: Failure::Status,
            errno: 0,
            status,
        });
    }
    let Some(want) = conf.body.as_deref() else {
        return Some(Outcome::Pass { status });
    };
    let body_start = find(data, b"\r\n\r\n")
        .map(|i| i + 4)
        .or_else(|| find(data, b"\n\n").map(|i| i + 2));
    if let Some(start) = body_start {
        if find(data.get(start..).unwrap_or_default(), want.as_bytes()).is_some() {
            return Some(Outcome::Pass { status });
        }
    }
    complete.then_some(Outcome::Fail {
        why: Failure::BodyMismatch,
        errno: 0,
        status,
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The status of an HTTP status line (`HTTP/1.x NNN ...`, with or without `\r`).
pub fn judge_status_line(line: &[u8]) -> Option<u16> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let rest = line.strip_prefix(b"HTTP/")?;
    let sp = rest.iter().position(|&b| b == b' ')?;
    let code = rest.get(sp + 1..sp + 4)?;
    if !code.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if rest.get(sp + 4).is_some_and(|&b| b != b' ') {
        return None;
    }
    std::str::from_utf8(code).ok()?.parse().ok()
}

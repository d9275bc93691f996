//! The text of a time the daemon keeps (ms since the Unix epoch) as a UTC date and time, for the
//! CLI's (`T` between date and time) and the web UI's (a space) formats. The calendar is the `time`
//! crate's.

/// `YYYY-MM-DD{between}HH:MM:SSZ` of `ms` since the Unix epoch (outside the years 1 to 9999: the
/// milliseconds as they are, `… ms`).
pub fn utc(ms: i64, between: char) -> String {
    match time::OffsetDateTime::from_unix_timestamp(ms.div_euclid(1000)) {
        Ok(t) if t.year() > 0 => format!(
            "{:04}-{:02}-{:02}{between}{:02}:{:02}:{:02}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        _ => format!("{ms} ms"),
    }
}

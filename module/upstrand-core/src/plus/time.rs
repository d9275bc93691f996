//! Times as the Plus API writes them: nginx's time syntax in server fields (`fail_timeout`,
//! `slow_start`: `10s`, `1m30s`, `500ms`) and ISO 8601 instants with millisecond resolution
//! (`downstart`, `selected`, `timestamp`).

use ::time::OffsetDateTime;

/// Parses nginx's time syntax into milliseconds: a sequence of numbers with units `ms`, `s`,
/// `m`, `h`, `d`, `w` (largest first, each at most once), or a bare number of seconds.
pub fn parse_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse::<u64>().ok()?.checked_mul(1000);
    }
    const UNITS: [(&str, u64); 6] = [
        ("w", 604_800_000),
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
        ("ms", 1),
    ];
    let mut rest = text;
    let mut total: u64 = 0;
    let mut last_rank = None;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let rank = UNITS.iter().position(|(u, _)| *u == unit)?;
        if last_rank.is_some_and(|l| rank <= l) {
            return None;
        }
        last_rank = Some(rank);
        total = total.checked_add(n.checked_mul(UNITS[rank].1)?)?;
    }
    Some(total)
}

/// A time in whole seconds as the API writes it back (`10s`).
pub fn seconds_text(s: u64) -> String {
    format!("{s}s")
}

/// An instant (milliseconds since the Unix epoch) in ISO 8601 with millisecond resolution, UTC:
/// `2026-12-04T15:44:01.123Z`.
pub fn iso8601_ms(epoch_ms: u64) -> String {
    let nanos = i128::from(epoch_ms) * 1_000_000;
    match OffsetDateTime::from_unix_timestamp_nanos(nanos) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.millisecond()
        ),
        // Beyond year 9999: cannot come from a clock.
        Err(_) => "9999-12-31T23:59:59.999Z".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_times_parse() {
        assert_eq!(parse_ms("10"), Some(10_000));
        assert_eq!(parse_ms("10s"), Some(10_000));
        assert_eq!(parse_ms("500ms"), Some(500));
        assert_eq!(parse_ms("1m30s"), Some(90_000));
        assert_eq!(parse_ms("2h"), Some(7_200_000));
        assert_eq!(parse_ms("1d"), Some(86_400_000));
        assert_eq!(parse_ms("0s"), Some(0));
        assert_eq!(parse_ms("0"), Some(0));
        for bad in [
            "",
            "s",
            "10x",
            "1s1m",
            "1s1s",
            "-1s",
            "1.5s",
            "99999999999999999999",
        ] {
            assert_eq!(parse_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn instants_are_iso8601_utc_with_milliseconds() {
        assert_eq!(iso8601_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601_ms(1_656_414_561_602), "2022-06-28T11:09:21.602Z");
        assert_eq!(seconds_text(10), "10s");
    }
}

//! Time values written the way nginx's `ngx_parse_time` reads them.

/// Parses an nginx time value into milliseconds: a sequence of `NUMBER[UNIT]` groups, optionally
/// separated by spaces, with units `ms`, `s`, `m`, `h`, `d`, `w`, `M` (30 days), `y` (365 days).
/// A number without unit means seconds; once a group has no unit it must be the last one.
/// Each unit may appear once and in decreasing order, as in nginx. Returns `None` for anything else
/// (empty text, unknown unit, overflow).
pub fn parse_time_ms(text: &str) -> Option<u64> {
    const UNITS: [(&str, u64); 8] = [
        ("y", 365 * 86_400_000),
        ("M", 30 * 86_400_000),
        ("w", 7 * 86_400_000),
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ];
    let bytes = text.as_bytes();
    if bytes.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    let mut i = 0;
    // Index into UNITS of the last unit used: the next one must be strictly smaller.
    let mut last_rank: Option<usize> = None;
    let mut groups = 0;
    while i < bytes.len() {
        if bytes[i] == b' ' {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if start == i {
            return None;
        }
        let value: u64 = text[start..i].parse().ok()?;
        groups += 1;
        // Unit: "ms" must be tested before "m".
        let rest = &text[i..];
        let (rank, len) = if rest.starts_with("ms") {
            (7, 2)
        } else {
            match rest.bytes().next() {
                None | Some(b' ') => {
                    // No unit: seconds, and nothing but spaces may follow.
                    if !rest.trim_start_matches(' ').is_empty() {
                        return None;
                    }
                    (6, 0)
                }
                Some(c) => match UNITS.iter().position(|(u, _)| u.as_bytes() == [c]) {
                    Some(rank) => (rank, 1),
                    None => return None,
                },
            }
        };
        if let Some(last) = last_rank {
            if rank <= last {
                return None;
            }
        }
        last_rank = Some(rank);
        total = total.checked_add(value.checked_mul(UNITS[rank].1)?)?;
        i += len;
    }
    if groups == 0 {
        return None;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::parse_time_ms;

    #[test]
    fn plain_number_is_seconds() {
        assert_eq!(parse_time_ms("60"), Some(60_000));
        assert_eq!(parse_time_ms("0"), Some(0));
    }

    #[test]
    fn units() {
        assert_eq!(parse_time_ms("60s"), Some(60_000));
        assert_eq!(parse_time_ms("500ms"), Some(500));
        assert_eq!(parse_time_ms("2m"), Some(120_000));
        assert_eq!(parse_time_ms("1h"), Some(3_600_000));
        assert_eq!(parse_time_ms("1d"), Some(86_400_000));
        assert_eq!(parse_time_ms("1w"), Some(7 * 86_400_000));
        assert_eq!(parse_time_ms("1M"), Some(30 * 86_400_000));
        assert_eq!(parse_time_ms("1y"), Some(365 * 86_400_000));
    }

    #[test]
    fn combinations() {
        assert_eq!(parse_time_ms("1m30s"), Some(90_000));
        assert_eq!(parse_time_ms("1h 30m"), Some(5_400_000));
        assert_eq!(parse_time_ms("1s500ms"), Some(1_500));
        assert_eq!(parse_time_ms("1m 5"), Some(65_000));
    }

    #[test]
    fn rejects_bad_values() {
        for bad in [
            "",
            " ",
            "s",
            "10x",
            "-1",
            "1.5s",
            "30s1m",
            "1s1s",
            "5 1m",
            "abc",
            "1ms5s",
            "99999999999999999999",
        ] {
            assert_eq!(parse_time_ms(bad), None, "{bad:?} should be rejected");
        }
    }
}

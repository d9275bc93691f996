//! Bounded NDJSON line reading and a tolerant scan for the `id` of a broken response line.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// One line read from a plugin.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line {
    /// A complete line (without its `\n`; a final line without `\n` counts too).
    Complete(Vec<u8>),
    /// A line longer than the limit: its first `limit` bytes and its full length. The rest was
    /// read and thrown away, so the stream stays in step.
    TooLong { prefix: Vec<u8>, len: usize },
    /// End of stream.
    Eof,
}

/// Reads one line of at most `limit` bytes (not counting the `\n`); never buffers more than `limit`.
pub(crate) async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    limit: usize,
) -> std::io::Result<Line> {
    let mut buf = Vec::new();
    let mut len = 0usize;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(if len == 0 {
                Line::Eof
            } else if len > limit {
                Line::TooLong { prefix: buf, len }
            } else {
                Line::Complete(buf)
            });
        }
        let (chunk, used, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (&avail[..i], i + 1, true),
            None => (avail, avail.len(), false),
        };
        let room = limit.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        len += chunk.len();
        r.consume(used);
        if done {
            return Ok(if len > limit {
                Line::TooLong { prefix: buf, len }
            } else {
                Line::Complete(buf)
            });
        }
    }
}

/// Finds a top-level numeric `"id"` in the start of a JSON object that may be cut off or broken
/// later on, e.g. `{"jsonrpc":"2.0","id":7,"result":{"targ`. Returns `None` when the id cannot be
/// read with certainty.
pub(crate) fn scan_id(b: &[u8]) -> Option<u64> {
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        i = skip_ws(b, i);
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let (key, next) = read_string(b, i)?;
        i = skip_ws(b, next);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        if key == b"id" {
            let start = i;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            if i == start {
                return None;
            }
            // The number must be complete: followed by a delimiter, not cut off.
            let after = skip_ws(b, i);
            if !matches!(b.get(after), Some(b',') | Some(b'}')) {
                return None;
            }
            return std::str::from_utf8(&b[start..i]).ok()?.parse().ok();
        }
        i = skip_value(b, i)?;
        i = skip_ws(b, i);
        match b.get(i) {
            Some(b',') => i += 1,
            _ => return None,
        }
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| c.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

/// Reads a string starting at the quote `b[i]`; returns its raw bytes and the index after it.
fn read_string(b: &[u8], i: usize) -> Option<(&[u8], usize)> {
    let mut j = i + 1;
    loop {
        match b.get(j)? {
            b'\\' => j += 2,
            b'"' => return Some((&b[i + 1..j], j + 1)),
            _ => j += 1,
        }
    }
}

fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => read_string(b, i).map(|(_, n)| n),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match b.get(j)? {
                    b'"' => {
                        j = read_string(b, j)?.1;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let mut j = i;
            while !matches!(b.get(j)?, b',' | b'}' | b']') && !b[j].is_ascii_whitespace() {
                j += 1;
            }
            Some(j)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_id_reads_ids_of_broken_lines() {
        assert_eq!(
            scan_id(br#"{"jsonrpc":"2.0","id":7,"result":{"targ"#),
            Some(7)
        );
        assert_eq!(scan_id(br#" { "id" : 12 , "x": 1}"#), Some(12));
        assert_eq!(
            scan_id(br#"{"jsonrpc":"2.0","result":{"a":[1,{"id":3}],"b":"}\"id\":4"},"id":9}"#),
            Some(9)
        );
        assert_eq!(scan_id(br#"{"result":{"a":1"#), None);
        assert_eq!(scan_id(br#"{"id":12"#), None, "cut-off number");
        assert_eq!(scan_id(b"not json"), None);
        assert_eq!(scan_id(br#"{"id":"abc"}"#), None);
        assert_eq!(scan_id(br#"{"data":{"id":5}}"#), None);
    }

    #[tokio::test]
    async fn read_line_bounds_and_resyncs() {
        let input = b"short\nthis line is too long\nnext\nlast-no-newline".to_vec();
        let mut r = tokio::io::BufReader::with_capacity(4, &input[..]);
        assert_eq!(
            read_line(&mut r, 10).await.unwrap(),
            Line::Complete(b"short".to_vec())
        );
        assert_eq!(
            read_line(&mut r, 10).await.unwrap(),
            Line::TooLong {
                prefix: b"this line ".to_vec(),
                len: 21
            }
        );
        assert_eq!(
            read_line(&mut r, 10).await.unwrap(),
            Line::Complete(b"next".to_vec())
        );
        assert_eq!(
            read_line(&mut r, 20).await.unwrap(),
            Line::Complete(b"last-no-newline".to_vec())
        );
        assert_eq!(read_line(&mut r, 10).await.unwrap(), Line::Eof);
    }
}

//! The DNS message format (RFC 1035), as much as the plugin needs: one-question queries with an
//! EDNS(0) OPT record, and answers with A, AAAA, CNAME and SRV records (others are skipped).

use std::net::{Ipv4Addr, Ipv6Addr};

pub const TYPE_A: u16 = 1;
pub const TYPE_CNAME: u16 = 5;
pub const TYPE_AAAA: u16 = 28;
pub const TYPE_SRV: u16 = 33;
const TYPE_OPT: u16 = 41;
const CLASS_IN: u16 = 1;

pub const RCODE_NOERROR: u8 = 0;
pub const RCODE_FORMERR: u8 = 1;
pub const RCODE_NXDOMAIN: u8 = 3;

/// UDP payload size announced in the OPT record.
pub const EDNS_UDP_SIZE: u16 = 4096;

/// A record's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RData {
    A(Ipv4Addr),
    Aaaa(Ipv6Addr),
    Cname(String),
    Srv {
        priority: u16,
        weight: u16,
        port: u16,
        target: String,
    },
    Other,
}

/// One resource record. Names are lower-case, without the final dot (the root is `""`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub name: String,
    pub ttl: u32,
    pub data: RData,
}

/// A parsed answer.
#[derive(Debug, Clone)]
pub struct Message {
    pub id: u16,
    pub is_response: bool,
    pub truncated: bool,
    pub rcode: u8,
    pub question: Option<(String, u16)>,
    pub answers: Vec<Record>,
    pub additionals: Vec<Record>,
}

/// Checks a DNS name (without the final dot): labels of 1–63 letters, digits, `-` or `_`, at most
/// 253 characters in all.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Encodes a query for `name` (already checked with [`valid_name`]) with recursion desired and,
/// with `edns`, an OPT record announcing [`EDNS_UDP_SIZE`].
pub fn build_query(id: u16, name: &str, qtype: u16, edns: bool) -> Vec<u8> {
    let mut m = Vec::with_capacity(32 + name.len());
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&0x0100u16.to_be_bytes()); // RD
    m.extend_from_slice(&1u16.to_be_bytes()); // QDCOUNT
    m.extend_from_slice(&0u16.to_be_bytes()); // ANCOUNT
    m.extend_from_slice(&0u16.to_be_bytes()); // NSCOUNT
    m.extend_from_slice(&u16::from(edns).to_be_bytes()); // ARCOUNT (OPT)
    for label in name.split('.').filter(|l| !l.is_empty()) {
        m.push(label.len() as u8);
        m.extend_from_slice(label.as_bytes());
    }
    m.push(0);
    m.extend_from_slice(&qtype.to_be_bytes());
    m.extend_from_slice(&CLASS_IN.to_be_bytes());
    if !edns {
        return m;
    }
    // OPT: root name, type, UDP size in the class, extended rcode/flags 0, no options.
    m.push(0);
    m.extend_from_slice(&TYPE_OPT.to_be_bytes());
    m.extend_from_slice(&EDNS_UDP_SIZE.to_be_bytes());
    m.extend_from_slice(&0u32.to_be_bytes());
    m.extend_from_slice(&0u16.to_be_bytes());
    m
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or("the answer ends too early")?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u16(&mut self) -> Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A possibly compressed name starting at the current position.
    fn name(&mut self) -> Result<String, String> {
        let mut out = String::new();
        let mut pos = self.pos;
        let mut jumped = false;
        let mut jumps = 0;
        loop {
            let len = *self.buf.get(pos).ok_or("a name runs past the answer")? as usize;
            match len & 0xC0 {
                0x00 if len == 0 => {
                    pos += 1;
                    break;
                }
                0x00 => {
                    let label = self
                        .buf
                        .get(pos + 1..pos + 1 + len)
                        .ok_or("a label runs past the answer")?;
                    if !out.is_empty() {
                        out.push('.');
                    }
                    for &b in label {
                        out.push(b.to_ascii_lowercase() as char);
                    }
                    if out.len() > 255 {
                        return Err("a name is longer than 255 characters".into());
                    }
                    pos += 1 + len;
                }
                0xC0 => {
                    let lo = *self.buf.get(pos + 1).ok_or("a name pointer is cut")? as usize;
                    if !jumped {
                        self.pos = pos + 2;
                        jumped = true;
                    }
                    jumps += 1;
                    if jumps > 64 {
                        return Err("name compression loops".into());
                    }
                    pos = ((len & 0x3F) << 8) | lo;
                }
                _ => return Err("unknown label type".into()),
            }
        }
        if !jumped {
            self.pos = pos;
        }
        Ok(out)
    }

    fn record(&mut self) -> Result<(Record, u16), String> {
        let name = self.name()?;
        let rtype = self.u16()?;
        let _class = self.u16()?;
        let ttl = self.u32()?;
        let len = self.u16()? as usize;
        let start = self.pos;
        let rdata = self.take(len)?;
        let data = match rtype {
            TYPE_A if len == 4 => RData::A(Ipv4Addr::new(rdata[0], rdata[1], rdata[2], rdata[3])),
            TYPE_AAAA if len == 16 => {
                let mut b = [0u8; 16];
                b.copy_from_slice(rdata);
                RData::Aaaa(Ipv6Addr::from(b))
            }
            TYPE_A | TYPE_AAAA => return Err("an address record has the wrong length".into()),
            TYPE_CNAME => {
                let mut r = Reader {
                    buf: self.buf,
                    pos: start,
                };
                RData::Cname(r.name()?)
            }
            TYPE_SRV => {
                let mut r = Reader {
                    buf: self.buf,
                    pos: start,
                };
                let priority = r.u16()?;
                let weight = r.u16()?;
                let port = r.u16()?;
                let target = r.name()?;
                if r.pos > start + len {
                    return Err("an SRV record runs past its length".into());
                }
                RData::Srv {
                    priority,
                    weight,
                    port,
                    target,
                }
            }
            _ => RData::Other,
        };
        // DNS TTLs are unsigned 31-bit (RFC 2181 §8): a set top bit means 0.
        let ttl = if ttl > i32::MAX as u32 { 0 } else { ttl };
        Ok((Record { name, ttl, data }, rtype))
    }
}

/// Parses a DNS message. Errors say what is wrong with it (never quoting it).
pub fn parse(buf: &[u8]) -> Result<Message, String> {
    let mut r = Reader { buf, pos: 0 };
    let id = r.u16()?;
    let flags = r.u16()?;
    let qd = r.u16()?;
    let an = r.u16()?;
    let ns = r.u16()?;
    let ar = r.u16()?;
    let mut question = None;
    for i in 0..qd {
        let name = r.name()?;
        let qtype = r.u16()?;
        let _class = r.u16()?;
        if i == 0 {
            question = Some((name, qtype));
        }
    }
    let truncated = flags & 0x0200 != 0;
    let mut answers = Vec::new();
    let mut additionals = Vec::new();
    // A truncated answer may end anywhere: keep what parses.
    let read = |count: u16, out: Option<&mut Vec<Record>>, r: &mut Reader| -> Result<(), String> {
        let mut out = out;
        for _ in 0..count {
            match r.record() {
                Ok((rec, rtype)) => {
                    if let Some(o) = out.as_deref_mut() {
                        if rtype != TYPE_OPT {
                            o.push(rec);
                        }
                    }
                }
                Err(_) if truncated => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    };
    read(an, Some(&mut answers), &mut r)?;
    read(ns, None, &mut r)?;
    read(ar, Some(&mut additionals), &mut r)?;
    Ok(Message {
        id,
        is_response: flags & 0x8000 != 0,
        truncated,
        rcode: (flags & 0x000F) as u8,
        question,
        answers,
        additionals,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_name("_http._tcp.api.example"));
        assert!(valid_name("a-b.c_d.example"));
        for bad in [
            "",
            "a..b",
            ".a",
            "a b.c",
            "a/b",
            &"x".repeat(64),
            &"a.".repeat(127),
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn query_layout() {
        let plain = build_query(0xBEEF, "ab.c", TYPE_SRV, false);
        assert_eq!(&plain[..12], &[0xBE, 0xEF, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(plain.len(), 22);
        let q = build_query(0xBEEF, "ab.c", TYPE_SRV, true);
        assert_eq!(&q[..12], &[0xBE, 0xEF, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1]);
        assert_eq!(&q[12..18], &[2, b'a', b'b', 1, b'c', 0]);
        assert_eq!(&q[18..22], &[0, 33, 0, 1]);
        assert_eq!(&q[22..], &[0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0]);
        // A query parses back as a message with its question.
        let m = parse(&q).unwrap();
        assert_eq!(m.id, 0xBEEF);
        assert!(!m.is_response);
        assert_eq!(m.question, Some(("ab.c".into(), TYPE_SRV)));
    }

    /// Builds a response by hand: question `s.x` SRV, one SRV answer whose target is compressed to
    /// point at the question name's `x`, one A record in the additional section.
    #[test]
    fn parses_compressed_answers() {
        let mut m = vec![0x12, 0x34, 0x85, 0x80, 0, 1, 0, 1, 0, 0, 0, 1];
        m.extend_from_slice(&[1, b's', 1, b'X', 0, 0, 33, 0, 1]); // question at 12; "x" at 14
        m.extend_from_slice(&[0xC0, 12, 0, 33, 0, 1, 0, 0, 0, 60, 0, 11]);
        m.extend_from_slice(&[0, 10, 0, 5, 0x1F, 0x90, 2, b'h', b'1', 0xC0, 14]);
        let h1 = m.len() - 5; // "h1.x"
        m.extend_from_slice(&[
            0xC0, h1 as u8, 0, 1, 0, 1, 0x80, 0, 0, 0, 0, 4, 127, 0, 0, 7,
        ]);
        let msg = parse(&m).unwrap();
        assert!(msg.is_response);
        assert_eq!(msg.rcode, RCODE_NOERROR);
        assert_eq!(msg.question, Some(("s.x".into(), TYPE_SRV)));
        assert_eq!(
            msg.answers,
            vec![Record {
                name: "s.x".into(),
                ttl: 60,
                data: RData::Srv {
                    priority: 10,
                    weight: 5,
                    port: 8080,
                    target: "h1.x".into()
                }
            }]
        );
        assert_eq!(
            msg.additionals,
            vec![Record {
                name: "h1.x".into(),
                ttl: 0, // top bit set: 0 (RFC 2181)
                data: RData::A(Ipv4Addr::new(127, 0, 0, 7))
            }]
        );
    }

    #[test]
    fn malformed_answers_are_errors_not_panics() {
        let good = {
            let mut m = vec![0, 1, 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0];
            m.extend_from_slice(&[1, b'a', 0, 0, 1, 0, 1]);
            m.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4, 1, 2, 3, 4]);
            m
        };
        assert!(parse(&good).is_ok());
        for cut in 0..good.len() {
            assert!(parse(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut looped = good.clone();
        looped[19] = 0xC0;
        looped[20] = 19; // the answer's name points at itself
        assert!(parse(&looped).is_err());
        let mut bad_len = good.clone();
        bad_len[30] = 3; // an A record of 3 bytes
        assert!(parse(&bad_len).is_err());
    }
}

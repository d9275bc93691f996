//! The DNS message format through `hickory-proto`, reduced to what the plugin needs: one-question
//! queries with an EDNS(0) OPT record, and answers as [`Message`] with A, AAAA, CNAME and SRV
//! records (others are [`RData::Other`]). Names come out lower-case, without the final dot.

use std::net::{Ipv4Addr, Ipv6Addr};

use hickory_proto::op::{Edns, Header, Message as DnsMessage, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RData as DnsRData, Record as DnsRecord, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};

pub const TYPE_A: u16 = 1;
pub const TYPE_AAAA: u16 = 28;
pub const TYPE_SRV: u16 = 33;

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
/// 253 characters in all. (Stricter than the wire format: these names come from a person.)
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
    let mut m = DnsMessage::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    // A checked name always converts; the fallback (the root) would only be asked, never crash.
    let mut qname = Name::from_ascii(name).unwrap_or_else(|_| Name::root());
    qname.set_fqdn(true);
    m.add_query(Query::query(qname, RecordType::from(qtype)));
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(EDNS_UDP_SIZE).set_version(0);
        m.set_edns(e);
    }
    // Encoding a one-question query into a Vec cannot fail.
    m.to_vec().unwrap_or_default()
}

fn name_text(n: &Name) -> String {
    let t = n.to_lowercase().to_ascii();
    t.strip_suffix('.').unwrap_or(&t).to_string()
}

fn record(r: &DnsRecord) -> Record {
    let data = match &r.data {
        DnsRData::A(a) => RData::A(a.0),
        DnsRData::AAAA(a) => RData::Aaaa(a.0),
        DnsRData::CNAME(c) => RData::Cname(name_text(&c.0)),
        DnsRData::SRV(s) => RData::Srv {
            priority: s.priority,
            weight: s.weight,
            port: s.port,
            target: name_text(&s.target),
        },
        _ => RData::Other,
    };
    // DNS TTLs are unsigned 31-bit (RFC 2181 §8): a set top bit means 0.
    let ttl = if r.ttl > i32::MAX as u32 { 0 } else { r.ttl };
    Record {
        name: name_text(&r.name),
        ttl,
        data,
    }
}

fn question(q: &Query) -> (String, u16) {
    (name_text(q.name()), u16::from(q.query_type()))
}

/// Parses a DNS message. Errors say what is wrong with it (never quoting it). A truncated answer
/// that does not parse whole still yields its header and question (the caller asks again over
/// TCP).
pub fn parse(buf: &[u8]) -> Result<Message, String> {
    match DnsMessage::from_vec(buf) {
        Ok(m) => Ok(Message {
            id: m.metadata.id,
            is_response: m.metadata.message_type == MessageType::Response,
            truncated: m.metadata.truncation,
            rcode: u8::try_from(u16::from(m.metadata.response_code)).unwrap_or(u8::MAX),
            question: m.queries.first().map(question),
            answers: m.answers.iter().map(record).collect(),
            additionals: m.additionals.iter().map(record).collect(),
        }),
        Err(e) => {
            let mut d = BinDecoder::new(buf);
            let header = Header::read(&mut d).map_err(|_| e.to_string())?;
            if !header.metadata.truncation {
                return Err(e.to_string());
            }
            let question = if header.counts.queries > 0 {
                Query::read(&mut d).ok().map(|q| question(&q))
            } else {
                None
            };
            Ok(Message {
                id: header.metadata.id,
                is_response: header.metadata.message_type == MessageType::Response,
                truncated: true,
                rcode: u8::try_from(u16::from(header.metadata.response_code)).unwrap_or(u8::MAX),
                question,
                answers: Vec::new(),
                additionals: Vec::new(),
            })
        }
    }
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

    #[test]
    fn a_truncated_answer_that_breaks_off_still_gives_its_header_and_question() {
        let mut m = vec![0xAB, 0xCD, 0x83, 0x80, 0, 1, 0, 2, 0, 0, 0, 0]; // QR, TC, RD; 2 answers
        m.extend_from_slice(&[1, b'a', 0, 0, 1, 0, 1]);
        m.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4, 1, 2, 3, 4]);
        m.extend_from_slice(&[0xC0, 12, 0, 1]); // the second answer breaks off
        let msg = parse(&m).unwrap();
        assert!(msg.truncated && msg.is_response);
        assert_eq!(msg.id, 0xABCD);
        assert_eq!(msg.question, Some(("a".into(), TYPE_A)));
        assert!(msg.answers.is_empty());
        // The same bytes without TC are malformed.
        m[2] = 0x81;
        assert!(parse(&m).is_err());
    }

    #[test]
    fn an_edns_answer_keeps_records_and_drops_the_opt_record() {
        let mut m = vec![0, 7, 0x81, 0x83, 0, 1, 0, 1, 0, 0, 0, 1]; // NXDOMAIN, one additional
        m.extend_from_slice(&[1, b'a', 0, 0, 28, 0, 1]);
        m.extend_from_slice(&[0xC0, 12, 0, 28, 0, 1, 0, 0, 0, 5, 0, 16]);
        m.extend_from_slice(&[0x20, 1, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        m.extend_from_slice(&[0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0]); // OPT
        let msg = parse(&m).unwrap();
        assert_eq!(msg.rcode, RCODE_NXDOMAIN);
        assert_eq!(
            msg.answers[0].data,
            RData::Aaaa("2001:db8::1".parse().unwrap())
        );
        assert!(msg.additionals.is_empty(), "{:?}", msg.additionals);
    }
}

//! A thin AWS Signature Version 4 signer (HMAC-SHA256), enough for signed query-API requests such
//! as EC2's DescribeInstances. Checked against the published SigV4 test suite vectors
//! (`get-vanilla`, `post-vanilla`) in the tests below.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// One request to sign.
pub struct Request<'a> {
    pub method: &'a str,
    /// The path, e.g. `/` (already in canonical form: segments URI-encoded).
    pub path: &'a str,
    /// The canonical query string (sorted, encoded), empty for none.
    pub query: &'a str,
    /// Headers to sign, names in any case; `host` and `x-amz-date` must be among them.
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
}

/// Credentials and scope.
pub struct Signer<'a> {
    pub access_key_id: &'a str,
    pub secret_access_key: &'a str,
    pub region: &'a str,
    pub service: &'a str,
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// AWS's URI encoding: unreserved characters (`A-Z a-z 0-9 - _ . ~`) as they are, every other byte
/// as `%XX` (upper-case hex).
pub fn uri_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `key=value&...` with both sides URI-encoded, in the given order (for request bodies and the
/// canonical query string when pairs are sorted first).
pub fn form(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", uri_encode(k), uri_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// (`YYYYMMDDTHHMMSSZ`, `YYYYMMDD`) for seconds since the Unix epoch (UTC).
/// (A time past the year 9999, which the clock does not give, signs as 1970-01-01.)
pub fn amz_timestamp(unix: u64) -> (String, String) {
    let t = i64::try_from(unix)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let date = format!("{:04}{:02}{:02}", t.year(), u8::from(t.month()), t.day());
    let time = format!("{:02}{:02}{:02}", t.hour(), t.minute(), t.second());
    (format!("{date}T{time}Z"), date)
}

impl Signer<'_> {
    /// The derived signing key for `date` (`YYYYMMDD`).
    pub fn signing_key(&self, date: &str) -> Vec<u8> {
        let k_date = hmac(
            format!("AWS4{}", self.secret_access_key).as_bytes(),
            date.as_bytes(),
        );
        let k_region = hmac(&k_date, self.region.as_bytes());
        let k_service = hmac(&k_region, self.service.as_bytes());
        hmac(&k_service, b"aws4_request")
    }

    /// The `Authorization` header value for `req` made at `amz_date` (`YYYYMMDDTHHMMSSZ`).
    pub fn authorization(&self, req: &Request<'_>, amz_date: &str) -> String {
        let date = &amz_date[..8];
        let mut headers: Vec<(String, String)> = req
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.to_ascii_lowercase(),
                    v.split_whitespace().collect::<Vec<_>>().join(" "),
                )
            })
            .collect();
        headers.sort();
        let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
        let signed_headers = headers
            .iter()
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>()
            .join(";");
        let canonical_request = format!(
            "{}\n{}\n{}\n{}\n{}\n{}",
            req.method,
            req.path,
            req.query,
            canonical_headers,
            signed_headers,
            sha256_hex(req.body)
        );
        let scope = format!("{date}/{}/{}/aws4_request", self.region, self.service);
        let string_to_sign = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
            sha256_hex(canonical_request.as_bytes())
        );
        let signature = hex(&hmac(&self.signing_key(date), string_to_sign.as_bytes()));
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
            self.access_key_id
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The SigV4 test suite's credentials and scope.
    const SUITE: Signer<'static> = Signer {
        access_key_id: "AKIDEXAMPLE",
        secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        region: "us-east-1",
        service: "service",
    };

    #[test]
    fn get_vanilla_from_the_sigv4_test_suite() {
        let req = Request {
            method: "GET",
            path: "/",
            query: "",
            headers: &[
                ("Host", "example.amazonaws.com"),
                ("X-Amz-Date", "20150830T123600Z"),
            ],
            body: b"",
        };
        assert_eq!(
            SUITE.authorization(&req, "20150830T123600Z"),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders=host;x-amz-date, \
             Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
    }

    #[test]
    fn post_vanilla_from_the_sigv4_test_suite() {
        let req = Request {
            method: "POST",
            path: "/",
            query: "",
            headers: &[
                ("X-Amz-Date", "20150830T123600Z"),
                ("Host", "example.amazonaws.com"),
            ],
            body: b"",
        };
        assert!(SUITE.authorization(&req, "20150830T123600Z").ends_with(
            "Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"
        ));
    }

    #[test]
    fn a_different_secret_gives_a_different_signature() {
        let other = Signer {
            secret_access_key: "x",
            ..SUITE
        };
        let req = Request {
            method: "GET",
            path: "/",
            query: "",
            headers: &[("host", "h"), ("x-amz-date", "20150830T123600Z")],
            body: b"",
        };
        assert_ne!(
            SUITE.authorization(&req, "20150830T123600Z"),
            other.authorization(&req, "20150830T123600Z")
        );
    }

    #[test]
    fn timestamps_and_encoding() {
        assert_eq!(
            amz_timestamp(1_440_938_160),
            ("20150830T123600Z".into(), "20150830".into())
        );
        assert_eq!(
            amz_timestamp(0),
            ("19700101T000000Z".into(), "19700101".into())
        );
        // 2024-02-29 23:59:59
        assert_eq!(amz_timestamp(1_709_251_199).0, "20240229T235959Z");
        assert_eq!(uri_encode("tag:a b/c~d"), "tag%3Aa%20b%2Fc~d");
        assert_eq!(
            form(&[("A".into(), "x=y".into()), ("B".into(), "ü".into())]),
            "A=x%3Dy&B=%C3%BC"
        );
    }
}

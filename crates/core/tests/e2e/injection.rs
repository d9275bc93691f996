//! Whatever a plugin answers, a kept target renders as exactly one harmless `server` line, and
//! whatever a person types, a kept directive is one line with no block, comment or include.
use serde_json::json;
use tributary_core::{render, validate, ExtraDirective, UpstreamName};

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn string(&mut self, alphabet: &[char], max_len: usize) -> String {
        let len = (self.next() as usize) % (max_len + 1);
        (0..len)
            .map(|_| alphabet[self.next() as usize % alphabet.len()])
            .collect()
    }
}

const NASTY: &[char] = &[
    'a', 'B', 'z', '0', '9', '.', '-', ':', '[', ']', '%', '/', ' ', ';', '{', '}', '#', '\n',
    '\t', '"', '\'', '\\', '$', '_', 'é', '\u{0}',
];

fn server_line_ok(line: &str) -> bool {
    let Some(rest) = line.strip_prefix("    server ") else {
        return false;
    };
    let Some(rest) = rest.strip_suffix(';') else {
        return false;
    };
    let mut parts = rest.split(' ');
    let (Some(addr), Some(weight), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    addr.chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ".-:[]".contains(c))
        && weight
            .strip_prefix("weight=")
            .is_some_and(|w| w.parse::<u16>().is_ok_and(|w| (1..=1000).contains(&w)))
}

#[test]
fn random_addresses_never_inject() {
    let mut rng = Lcg(7);
    let name = UpstreamName::parse("api").unwrap();
    let mut kept = 0;
    for _ in 0..20_000 {
        let address = rng.string(NASTY, 24);
        let port = (rng.next() % 70_000) as i64 - 1000;
        let raw =
            json!({"address": address, "port": port, "weight": (rng.next() % 1100) as i64 - 50});
        let v = validate(std::slice::from_ref(&raw));
        let out = render(&name, &v.targets, &[]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3 + v.targets.len(), "{raw} -> {out:?}");
        for line in &lines[2..lines.len() - 1] {
            assert!(server_line_ok(line), "{raw} rendered {line:?}");
        }
        kept += v.targets.len();
    }
    assert!(
        kept > 0,
        "the generator should produce some valid targets too"
    );
}

#[test]
fn random_directives_are_single_safe_lines() {
    let mut rng = Lcg(11);
    let mut kept = 0;
    for _ in 0..20_000 {
        let mut text = rng.string(NASTY, 20);
        if rng.next() % 2 == 0 {
            text = format!("keepalive {text};");
        }
        if let Ok(d) = ExtraDirective::parse(&text) {
            kept += 1;
            let s = d.as_str();
            assert!(s.ends_with(';') && s.matches(';').count() == 1, "{s:?}");
            assert!(!s.contains(['{', '}', '#', '\n', '\r', '\0']), "{s:?}");
            assert!(!s.to_ascii_lowercase().starts_with("include"), "{s:?}");
        }
    }
    assert!(kept > 0);
}

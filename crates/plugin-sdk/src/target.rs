//! Targets as the protocol wants them, and the `address:port[:weight]` text entries the static,
//! file and etcd plugins read.

use serde_json::{json, Value};

/// A target as the protocol wants it: `{"address", "port", "weight"?}`.
pub fn target(address: impl Into<String>, port: u16, weight: Option<u16>) -> Value {
    let mut t = json!({"address": address.into(), "port": port});
    if let Some(w) = weight {
        t["weight"] = json!(w);
    }
    t
}

/// A server written as text, `address:port[:weight]` (IPv6 as `[addr]:port[:weight]`), split into
/// its pieces as written. Checking the address and the weight is the plugin's; [`parse_port`] reads
/// the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetText<'a> {
    pub address: &'a str,
    pub port: &'a str,
    pub weight: Option<&'a str>,
}

/// Splits `address:port[:weight]` (IPv6 as `[addr]:port[:weight]`). The error says what is wrong
/// without quoting the text (config values are secret).
pub fn split_target(entry: &str) -> Result<TargetText<'_>, &'static str> {
    let (address, rest) = if let Some(after) = entry.strip_prefix('[') {
        let (addr, rest) = after
            .split_once(']')
            .ok_or("`[` without `]` (IPv6 is written [addr]:port)")?;
        let rest = rest
            .strip_prefix(':')
            .ok_or("a port must follow `]:` (IPv6 is written [addr]:port)")?;
        (addr, rest)
    } else {
        let (addr, rest) = entry
            .split_once(':')
            .ok_or("expected address:port[:weight]")?;
        if rest.split(':').count() > 2 {
            return Err("too many `:` (write IPv6 as [addr]:port[:weight])");
        }
        (addr, rest)
    };
    let (port, weight) = match rest.split_once(':') {
        Some((p, w)) => (p, Some(w)),
        None => (rest, None),
    };
    Ok(TargetText {
        address,
        port,
        weight,
    })
}

/// A port written as text: a number from 1 to 65535.
pub fn parse_port(text: &str) -> Result<u16, &'static str> {
    text.parse()
        .ok()
        .filter(|p| *p >= 1)
        .ok_or("port must be a number from 1 to 65535")
}

/// A weight written as text, for plugins where `0` means "no weight" (nginx's default, 1): `0` to
/// `1000`, `0` giving `None`.
pub fn parse_weight(text: &str) -> Result<Option<u16>, &'static str> {
    text.parse::<u16>()
        .ok()
        .filter(|w| *w <= 1000)
        .map(|w| (w > 0).then_some(w))
        .ok_or("weight must be a number from 0 to 1000 (0 means 1)")
}

/// [`parse_weight`] for a JSON `weight` member: absent or `null` is `None`; else a whole number from
/// `0` to `1000`, `0` giving `None`.
pub fn weight_value(v: Option<&Value>) -> Result<Option<u16>, &'static str> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(w) => w
            .as_u64()
            .filter(|w| *w <= 1000)
            .map(|w| (w > 0).then_some(w as u16))
            .ok_or("weight must be a whole number from 0 to 1000 (0 means 1)"),
    }
}

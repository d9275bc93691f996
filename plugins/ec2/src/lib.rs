//! The `ec2` discovery plugin: provider `ec2` resolves a tag filter `key=value` into the running
//! EC2 instances carrying that tag, through the EC2 query API (`DescribeInstances`, version
//! 2016-11-15), signed with our own thin SigV4 ([`sigv4`]).
//!
//! - Filters sent: `tag:<key>` = `<value>` and `instance-state-name` = `running` (and only running
//!   instances are kept from the answer as well).
//! - Address: `privateIpAddress` (default) or `ipAddress` with `address_type` = `public`
//!   (instances without one are left out); every target gets the config's `port`.
//! - Weight: the instance's `weight` tag when it is a whole number (kept within 1–1000).
//! - Credentials travel only in the signed `Authorization` header; the request is a form POST, so
//!   nothing is in the URL.
//! - Errors: AWS refusing the credentials (`AuthFailure`, `InvalidClientTokenId`, ...) → -32003
//!   `access_key_id`; `SignatureDoesNotMatch` → -32003 `secret_access_key`; not allowed to call
//!   DescribeInstances → -32003 `access_key_id`; bad `region`, `endpoint`, `port`,
//!   `address_type` or `service` → -32003 naming it; endpoint down, timing out or answering
//!   something else → -32000. No instance matching is an empty list (EC2 has no "unknown tag").
#![forbid(unsafe_code)]

pub mod sigv4;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use reqwest::Url;
use serde_json::Value;
use tributary_plugin_sdk::{root_cause, ConfigExt, Plugin, ResolveParams, ResolveResult, RpcError};

/// How long one request to the EC2 endpoint may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

const API_VERSION: &str = "2016-11-15";
const FORM: &str = "application/x-www-form-urlencoded; charset=utf-8";

/// The plugin. One HTTP client (connection pool) for every call.
pub struct Ec2 {
    client: reqwest::Client,
    timeout: Duration,
}

impl Ec2 {
    /// A plugin whose requests give up after `timeout`.
    pub fn new(timeout: Duration) -> Ec2 {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .user_agent(concat!("tributary-plugin-ec2/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("HTTP client");
        Ec2 { client, timeout }
    }
}

impl Plugin for Ec2 {
    fn manifest(&self) -> Option<&str> {
        Some(include_str!("../plugin.json"))
    }

    async fn resolve(&self, params: ResolveParams) -> Result<ResolveResult, RpcError> {
        let q = Query::from_params(&params)?;
        let mut targets = Vec::new();
        let mut next: Option<String> = None;
        for _page in 0..1000 {
            let page = self.describe(&q, next.as_deref()).await?;
            targets.extend(page.targets);
            match page.next_token {
                Some(t) if !t.is_empty() => next = Some(t),
                _ => {
                    return Ok(ResolveResult {
                        targets,
                        ttl_seconds: 0,
                    })
                }
            }
        }
        Err(RpcError::provider(
            "DescribeInstances kept answering nextToken (over 1000 pages)",
        ))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AddressType {
    Private,
    Public,
}

#[derive(Debug)]
struct Query {
    url: Url,
    host: String,
    region: String,
    access_key_id: String,
    secret_access_key: String,
    port: u16,
    address_type: AddressType,
    tag_key: String,
    tag_value: String,
}

impl Query {
    fn from_params(params: &ResolveParams) -> Result<Query, RpcError> {
        let c = &params.config;
        let region = c.required_str("region")?;
        let access_key_id = c.required_str("access_key_id")?;
        let secret_access_key = c.required_str("secret_access_key")?;
        let port = match c.number("port")? {
            Some(p) if p.fract() == 0.0 && (1.0..=65535.0).contains(&p) => p as u16,
            Some(_) => {
                return Err(RpcError::config(
                    "port",
                    "port must be a whole number from 1 to 65535",
                ))
            }
            None => return Err(RpcError::config("port", "missing required field \"port\"")),
        };
        if !region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            || region.len() > 32
        {
            return Err(RpcError::config(
                "region",
                "region must look like eu-west-1 (lower-case letters, digits, `-`)",
            ));
        }
        if access_key_id
            .bytes()
            .any(|b| !b.is_ascii_graphic() || b == b'/')
        {
            return Err(RpcError::config(
                "access_key_id",
                "access_key_id holds characters an access key id never has",
            ));
        }
        let address_type = match c.optional_str("address_type")? {
            None | Some("private") => AddressType::Private,
            Some("public") => AddressType::Public,
            Some(_) => {
                return Err(RpcError::config(
                    "address_type",
                    "address_type must be private or public",
                ))
            }
        };
        let url = match c.optional_str("endpoint")? {
            Some(e) => parse_endpoint(e)?,
            None => {
                let suffix = if region.starts_with("cn-") {
                    "amazonaws.com.cn"
                } else {
                    "amazonaws.com"
                };
                Url::parse(&format!("https://ec2.{region}.{suffix}/")).map_err(|_| {
                    RpcError::config("region", "region does not make a valid endpoint")
                })?
            }
        };
        let host = match (url.host_str(), url.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            (None, _) => return Err(RpcError::config("endpoint", "endpoint has no host")),
        };
        let (tag_key, tag_value) = match params.service.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() => {
                (k.trim().to_string(), v.trim().to_string())
            }
            _ => {
                return Err(RpcError::config(
                    "service",
                    "service must be a tag filter key=value, such as app=web",
                ))
            }
        };
        Ok(Query {
            url,
            host,
            region: region.to_string(),
            access_key_id: access_key_id.to_string(),
            secret_access_key: secret_access_key.to_string(),
            port,
            address_type,
            tag_key,
            tag_value,
        })
    }
}

fn parse_endpoint(text: &str) -> Result<Url, RpcError> {
    let url = Url::parse(text).map_err(|_| {
        RpcError::config(
            "endpoint",
            "endpoint must be a URL such as https://ec2.eu-west-1.amazonaws.com",
        )
    })?;
    if !matches!(url.scheme(), "http" | "https")
        || url.host_str().is_none_or(str::is_empty)
        || url.query().is_some()
        || url.fragment().is_some()
        || !url.username().is_empty()
        || url.password().is_some()
        || url.path() != "/"
    {
        return Err(RpcError::config(
            "endpoint",
            "endpoint must be a plain http(s)://host[:port] URL",
        ));
    }
    Ok(url)
}

/// One page of DescribeInstances.
#[derive(Debug, Default)]
struct Page {
    targets: Vec<Value>,
    next_token: Option<String>,
}

impl Ec2 {
    async fn describe(&self, q: &Query, next: Option<&str>) -> Result<Page, RpcError> {
        let mut pairs: Vec<(String, String)> = vec![
            ("Action".into(), "DescribeInstances".into()),
            ("Version".into(), API_VERSION.into()),
            ("Filter.1.Name".into(), format!("tag:{}", q.tag_key)),
            ("Filter.1.Value.1".into(), q.tag_value.clone()),
            ("Filter.2.Name".into(), "instance-state-name".into()),
            ("Filter.2.Value.1".into(), "running".into()),
            ("MaxResults".into(), "1000".into()),
        ];
        if let Some(t) = next {
            pairs.push(("NextToken".into(), t.to_string()));
        }
        let body = sigv4::form(&pairs);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let (amz_date, _) = sigv4::amz_timestamp(now);
        let signer = sigv4::Signer {
            access_key_id: &q.access_key_id,
            secret_access_key: &q.secret_access_key,
            region: &q.region,
            service: "ec2",
        };
        let auth = signer.authorization(
            &sigv4::Request {
                method: "POST",
                path: "/",
                query: "",
                headers: &[
                    ("content-type", FORM),
                    ("host", &q.host),
                    ("x-amz-date", &amz_date),
                ],
                body: body.as_bytes(),
            },
            &amz_date,
        );
        let mut auth = HeaderValue::from_str(&auth).map_err(|_| {
            RpcError::config(
                "access_key_id",
                "access_key_id holds characters that cannot travel in an HTTP header",
            )
        })?;
        auth.set_sensitive(true);
        let host = HeaderValue::from_str(&q.host)
            .map_err(|_| RpcError::config("endpoint", "endpoint host is not a valid header"))?;
        let resp = self
            .client
            .post(q.url.clone())
            .header(HOST, host)
            .header(CONTENT_TYPE, FORM)
            .header("x-amz-date", &amz_date)
            .header(AUTHORIZATION, auth)
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport_error(&e))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| self.transport_error(&e))?;
        if status.is_success() {
            return parse_instances(&text, q);
        }
        Err(aws_error(status.as_u16(), &text))
    }

    fn transport_error(&self, e: &reqwest::Error) -> RpcError {
        if e.is_timeout() {
            return RpcError::provider(format!(
                "the EC2 endpoint did not answer within {} s",
                self.timeout.as_secs_f64()
            ));
        }
        // reqwest's own text carries the URL: name the innermost cause instead.
        let cause = root_cause(e);
        if e.is_connect() {
            return RpcError::provider(format!("cannot connect to the EC2 endpoint: {cause}"));
        }
        RpcError::provider(format!("request to the EC2 endpoint failed: {cause}"))
    }
}

/// An AWS error answer (`<Response><Errors><Error><Code>..<Message>..`) as a protocol error.
fn aws_error(status: u16, body: &str) -> RpcError {
    let (code, message) = match roxmltree::Document::parse(body) {
        Ok(doc) => {
            let find = |name: &str| {
                doc.descendants()
                    .find(|n| n.has_tag_name(name))
                    .and_then(|n| n.text())
                    .map(|t| t.trim().to_string())
                    .unwrap_or_default()
            };
            (find("Code"), find("Message"))
        }
        Err(_) => (String::new(), String::new()),
    };
    let short: String = message.chars().take(160).collect();
    match code.as_str() {
        "AuthFailure"
        | "InvalidClientTokenId"
        | "UnrecognizedClientException"
        | "InvalidAccessKeyId"
        | "InvalidSecurity" => RpcError::config(
            "access_key_id",
            format!(
                "AWS rejected the credentials ({code}): check access_key_id and secret_access_key"
            ),
        ),
        "SignatureDoesNotMatch" | "IncompleteSignature" => RpcError::config(
            "secret_access_key",
            format!("AWS rejected the request signature ({code}): check secret_access_key"),
        ),
        "UnauthorizedOperation" | "AccessDenied" | "AccessDeniedException" => RpcError::config(
            "access_key_id",
            format!("the credentials may not call ec2:DescribeInstances ({code})"),
        ),
        "" => RpcError::provider(format!(
            "the EC2 endpoint answered HTTP {status} without an AWS error"
        )),
        _ => RpcError::provider(format!(
            "the EC2 endpoint answered HTTP {status}: {code}{}",
            if short.is_empty() {
                String::new()
            } else {
                format!(": {short}")
            }
        )),
    }
}

fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    n.children().find(|c| c.has_tag_name(name))
}

fn child_text<'a>(n: roxmltree::Node<'a, '_>, name: &str) -> Option<&'a str> {
    child(n, name).and_then(|c| c.text()).map(str::trim)
}

/// DescribeInstancesResponse → targets of running instances.
fn parse_instances(body: &str, q: &Query) -> Result<Page, RpcError> {
    let doc = roxmltree::Document::parse(body)
        .map_err(|_| RpcError::provider("unexpected answer from the EC2 endpoint: not XML"))?;
    let root = doc.root_element();
    if !root.has_tag_name("DescribeInstancesResponse") {
        return Err(RpcError::provider(
            "unexpected answer from the EC2 endpoint: not a DescribeInstancesResponse",
        ));
    }
    let mut page = Page {
        next_token: child_text(root, "nextToken").map(str::to_string),
        ..Page::default()
    };
    let reservations = child(root, "reservationSet")
        .into_iter()
        .flat_map(|r| r.children().filter(|c| c.has_tag_name("item")));
    for reservation in reservations {
        let instances = child(reservation, "instancesSet")
            .into_iter()
            .flat_map(|s| s.children().filter(|c| c.has_tag_name("item")));
        for inst in instances {
            let state = child(inst, "instanceState").and_then(|s| child_text(s, "name"));
            if state != Some("running") {
                continue;
            }
            let address = match q.address_type {
                AddressType::Private => child_text(inst, "privateIpAddress"),
                AddressType::Public => child_text(inst, "ipAddress"),
            };
            let Some(address) = address.filter(|a| !a.is_empty()) else {
                continue;
            };
            let tags: Vec<(&str, &str)> = child(inst, "tagSet")
                .into_iter()
                .flat_map(|s| s.children().filter(|c| c.has_tag_name("item")))
                .filter_map(|t| Some((child_text(t, "key")?, child_text(t, "value").unwrap_or(""))))
                .collect();
            let weight = tags
                .iter()
                .find(|(k, _)| *k == "weight")
                .and_then(|(_, v)| v.parse::<i64>().ok())
                .map(|w| w.clamp(1, 1000) as u16);
            let mut t = tributary_plugin_sdk::target(address, q.port, weight);
            let mut labels = Vec::new();
            if let Some(id) = child_text(inst, "instanceId") {
                labels.push(id.to_string());
            }
            if let Some((_, name)) = tags.iter().find(|(k, _)| *k == "Name") {
                labels.push(name.to_string());
            }
            if !labels.is_empty() {
                t["tags"] = Value::from(labels);
            }
            page.targets.push(t);
        }
    }
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn query(address_type: AddressType) -> Query {
        Query {
            url: Url::parse("http://127.0.0.1:1/").unwrap(),
            host: "127.0.0.1:1".into(),
            region: "us-east-1".into(),
            access_key_id: "AKID".into(),
            secret_access_key: "s".into(),
            port: 8080,
            address_type,
            tag_key: "app".into(),
            tag_value: "web".into(),
        }
    }

    const ANSWER: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>r-1</requestId>
  <reservationSet>
    <item>
      <reservationId>r-0a</reservationId>
      <instancesSet>
        <item>
          <instanceId>i-1</instanceId>
          <instanceState><code>16</code><name>running</name></instanceState>
          <privateIpAddress>10.0.0.1</privateIpAddress>
          <ipAddress>54.1.2.3</ipAddress>
          <tagSet>
            <item><key>app</key><value>web</value></item>
            <item><key>weight</key><value>5000</value></item>
            <item><key>Name</key><value>web-a</value></item>
          </tagSet>
        </item>
        <item>
          <instanceId>i-2</instanceId>
          <instanceState><code>80</code><name>stopped</name></instanceState>
          <privateIpAddress>10.0.0.2</privateIpAddress>
        </item>
        <item>
          <instanceId>i-3</instanceId>
          <instanceState><code>16</code><name>running</name></instanceState>
          <privateIpAddress>10.0.0.3</privateIpAddress>
          <tagSet><item><key>weight</key><value>heavy</value></item></tagSet>
        </item>
      </instancesSet>
    </item>
  </reservationSet>
  <nextToken>tok-2</nextToken>
</DescribeInstancesResponse>"#;

    #[test]
    fn parses_running_instances_weights_and_addresses() {
        let p = parse_instances(ANSWER, &query(AddressType::Private)).unwrap();
        assert_eq!(p.next_token.as_deref(), Some("tok-2"));
        assert_eq!(
            p.targets,
            vec![
                json!({"address":"10.0.0.1","port":8080,"weight":1000,"tags":["i-1","web-a"]}),
                json!({"address":"10.0.0.3","port":8080,"tags":["i-3"]}),
            ]
        );
        let p = parse_instances(ANSWER, &query(AddressType::Public)).unwrap();
        assert_eq!(p.targets.len(), 1);
        assert_eq!(p.targets[0]["address"], "54.1.2.3");
        assert_eq!(
            parse_instances("<x/>", &query(AddressType::Private))
                .unwrap_err()
                .code,
            tributary_plugin_sdk::ERR_PROVIDER
        );
    }

    #[test]
    fn aws_errors_map_to_fields() {
        let body = |code: &str| {
            format!("<Response><Errors><Error><Code>{code}</Code><Message>m</Message></Error></Errors></Response>")
        };
        assert_eq!(
            aws_error(401, &body("AuthFailure")).field(),
            Some("access_key_id")
        );
        assert_eq!(
            aws_error(403, &body("SignatureDoesNotMatch")).field(),
            Some("secret_access_key")
        );
        assert_eq!(
            aws_error(403, &body("UnauthorizedOperation")).field(),
            Some("access_key_id")
        );
        let e = aws_error(503, &body("RequestLimitExceeded"));
        assert_eq!(e.code, tributary_plugin_sdk::ERR_PROVIDER);
        assert!(e.message.contains("RequestLimitExceeded"));
        assert_eq!(
            aws_error(500, "<html>").code,
            tributary_plugin_sdk::ERR_PROVIDER
        );
    }
}

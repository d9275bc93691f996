//! A Plus write (`POST .../servers`, `PATCH`/`DELETE .../servers/ID`) as the whole-set change
//! the native `PUT` applies: the current set read from the zone, changed by the one server, with
//! the generation it was read at (`PutRequest::generation`), so the module's
//! `LiveUpstream::apply` refuses it when another writer changed the set in between and the
//! module plans again from the new set. Two concurrent writers therefore never lose each
//! other's servers. Servers that stay keep their peer, state, statistics and id.

use std::collections::HashSet;

use serde_json::json;

use super::body::ServerFields;
use super::view::ConfServer;
use super::PlusError;
use crate::live::render::{ServerView, UpstreamView};
use crate::live::{Addr, PutRequest, Server};

/// A write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    /// `POST .../servers`
    Add(ServerFields),
    /// `PATCH .../servers/ID`
    Patch(u64, ServerFields),
    /// `DELETE .../servers/ID`
    Delete(u64),
}

/// nginx's defaults for a server the body does not describe fully (`server` directive).
const DEFAULT_MAX_FAILS: u32 = 1;
const DEFAULT_FAIL_TIMEOUT_S: u32 = 10;

fn immutable(text: String) -> PlusError {
    PlusError::new(400, "UpstreamServerImmutable", text)
}

/// A server of the current set as a `PUT` would give it again.
fn as_server(s: &ServerView) -> Result<Server, PlusError> {
    let addr = Addr::parse(&s.address).map_err(|e| {
        PlusError::new(
            500,
            "InternalError",
            format!("server {} of the zone: {}", s.address, e.message),
        )
    })?;
    let small = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    Ok(Server {
        addr,
        weight: small(s.weight),
        max_fails: small(s.max_fails),
        fail_timeout_s: small(s.fail_timeout_ms / 1000),
        max_conns: small(s.max_conns),
        backup: s.backup,
        down: s.down,
        drain: s.drain,
    })
}

fn find(view: &UpstreamView, id: u64) -> Result<usize, PlusError> {
    view.servers
        .iter()
        .position(|s| s.id == Some(id))
        .ok_or_else(|| PlusError::server_not_found(id))
}

/// The `PUT` that makes `op` on the set `view` (guarded by `view`'s generation).
pub fn plan(view: &UpstreamView, op: &WriteOp) -> Result<PutRequest, PlusError> {
    let mut servers = view
        .servers
        .iter()
        .map(as_server)
        .collect::<Result<Vec<_>, _>>()?;
    match op {
        WriteOp::Add(f) => {
            // An `id` (a server read back with GET and sent again, as nginx-plus-go-client does
            // when it adds back a server another writer removed) is ignored: the new server gets
            // a new id, ids are never given twice.
            let Some(addr) = f.server.clone() else {
                return Err(PlusError::new(
                    400,
                    "UpstreamConfFormatError",
                    "missing \"server\" argument",
                ));
            };
            if servers.iter().any(|s| s.addr == addr) {
                return Err(PlusError::new(
                    409,
                    "EntryExists",
                    format!("server {} already exists in the upstream", addr.name()),
                ));
            }
            servers.push(Server {
                addr,
                weight: f.weight.unwrap_or(1),
                max_fails: f.max_fails.unwrap_or(DEFAULT_MAX_FAILS),
                fail_timeout_s: f.fail_timeout_s.unwrap_or(DEFAULT_FAIL_TIMEOUT_S),
                max_conns: f.max_conns.unwrap_or(0),
                backup: f.backup.unwrap_or(false),
                down: f.down.unwrap_or(false),
                drain: f.drain.unwrap_or(false),
            });
        }
        WriteOp::Patch(id, f) => {
            let i = find(view, *id)?;
            let s = &mut servers[i];
            if f.id.is_some_and(|given| given != *id) {
                return Err(PlusError::new(
                    400,
                    "UpstreamBadServerId",
                    format!(
                        "\"id\" {} differs from the server's ID {id}: IDs cannot be changed",
                        f.id.unwrap_or(0)
                    ),
                ));
            }
            if let Some(a) = f.server.as_ref().filter(|a| **a != s.addr) {
                return Err(immutable(format!(
                    "server \"{id}\" address is immutable ({} cannot become {}): DELETE it and POST the new address",
                    s.addr.name(),
                    a.name()
                )));
            }
            if f.backup.is_some_and(|b| b != s.backup) {
                return Err(immutable(format!(
                    "server \"{id}\": \"backup\" cannot be changed: DELETE it and POST it again"
                )));
            }
            s.weight = f.weight.unwrap_or(s.weight);
            s.max_fails = f.max_fails.unwrap_or(s.max_fails);
            s.fail_timeout_s = f.fail_timeout_s.unwrap_or(s.fail_timeout_s);
            s.max_conns = f.max_conns.unwrap_or(s.max_conns);
            s.down = f.down.unwrap_or(s.down);
            s.drain = f.drain.unwrap_or(s.drain);
        }
        WriteOp::Delete(id) => {
            let i = find(view, *id)?;
            servers.remove(i);
            if !servers.iter().any(|s| !s.backup) {
                return Err(immutable(format!(
                    "server \"{id}\" not removable: it is the upstream's last server that is not backup (add another first)"
                )));
            }
        }
    }
    let mut seen = HashSet::new();
    if let Some(dup) = servers.iter().find(|s| !seen.insert(&s.addr)) {
        return Err(PlusError::new(
            409,
            "UpstreamConflict",
            format!(
                "the upstream lists {} twice (in its configuration); change it by a reload",
                dup.addr.name()
            ),
        ));
    }
    Ok(PutRequest {
        servers,
        generation: Some(view.generation),
    })
}

/// The answer to an applied `op`, from the set read back after it (`after`): `POST` 201 and the
/// new server, `PATCH` 200 and the server, `DELETE` 200 and the servers left. A server another
/// writer removed before the read-back is answered without what is gone (`POST`: its address
/// only; `PATCH`: 404).
pub fn answer(op: &WriteOp, after: &UpstreamView) -> Result<(u16, String), PlusError> {
    use super::view::to_json;
    match op {
        WriteOp::Add(f) => {
            let name = f.server.as_ref().map(Addr::name).unwrap_or_default();
            Ok(match after.servers.iter().find(|s| s.address == name) {
                Some(s) => (201, to_json(&ConfServer::of(s))),
                None => (201, to_json(&json!({ "server": name }))),
            })
        }
        WriteOp::Patch(id, _) => {
            let i = find(after, *id)?;
            Ok((200, to_json(&ConfServer::of(&after.servers[i]))))
        }
        WriteOp::Delete(_) => Ok((200, to_json(&ConfServer::all(after)))),
    }
}

#[cfg(test)]
#[path = "write_tests.rs"]
mod tests;

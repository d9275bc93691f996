//! `dynamic_upstrand $RESULT $VAR1 [$VAR2 ...] [LITERAL];` and its part of the location
//! configuration.

use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_uint_t, NGX_CONF_2MORE, NGX_HTTP_LIF_CONF, NGX_HTTP_LOC_CONF,
    NGX_HTTP_LOC_CONF_OFFSET, NGX_HTTP_SRV_CONF, NGX_HTTP_VAR_CHANGEABLE, NGX_HTTP_VAR_NOCACHEABLE,
};
use upstrand_core::upstrand::dynamic::{choose, parse_args};

use super::request::upstrand_value;
use super::Registry;
use crate::ffi::conf::{ConfExt, ConfPart, Directive};
use crate::ffi::request::Req;
use crate::ffi::variables::{add_variable, variable_index, VarSlot, Variable};
use crate::ffi::{command, ConfFail, Status};

/// Directive table entry: `dynamic_upstrand $RESULT $VAR... [LITERAL]` (server, location, if in
/// location).
pub const COMMAND: ngx_command_t = command::<Handler>(
    c"dynamic_upstrand",
    NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF | NGX_HTTP_LIF_CONF | NGX_CONF_2MORE,
    NGX_HTTP_LOC_CONF_OFFSET,
);

/// One `dynamic_upstrand` declaration (variable indexes of the request's variables array).
#[derive(Clone, Debug)]
struct Entry {
    result: ngx_uint_t,
    candidates: Vec<ngx_uint_t>,
    default: Option<String>,
}

/// The `dynamic_upstrand` declarations in force in a location (its part of the location
/// configuration).
#[derive(Default)]
pub struct Declarations {
    entries: Vec<Entry>,
}

impl Declarations {
    /// Merge: declarations of the enclosing level are inherited unless the same result variable
    /// is declared again here.
    pub fn inherit(&mut self, parent: &Declarations) {
        let inherited: Vec<Entry> = parent
            .entries
            .iter()
            .filter(|e| !self.entries.iter().any(|c| c.result == e.result))
            .cloned()
            .collect();
        self.entries.extend(inherited);
    }
}

struct Handler;

impl Directive for Handler {
    fn handle(cf: &mut ngx_conf_t) -> Result<(), ConfFail> {
        declare(cf)
    }
}

/// Index of variable `name` (without `$`), registering it as used.
fn index(cf: &mut ngx_conf_t, name: &str) -> Result<ngx_uint_t, ConfFail> {
    variable_index(cf, name.as_bytes()).ok_or(ConfFail::Logged)
}

/// Registers the result variable of one declaration and records the declaration in the
/// location's part.
fn declare(cf: &mut ngx_conf_t) -> Result<(), ConfFail> {
    let texts = cf.param_texts();
    let args: Vec<&str> = texts.iter().map(String::as_str).collect();
    let spec = parse_args(&args)?;
    // nginx logs why it refuses a name.
    let v = add_variable(
        cf,
        spec.result.as_bytes(),
        NGX_HTTP_VAR_CHANGEABLE | NGX_HTTP_VAR_NOCACHEABLE,
    )
    .ok_or(ConfFail::Logged)?;
    let result = index(cf, &spec.result)?;
    v.set_handler::<DynamicVariable>(result);
    let candidates = spec
        .candidates
        .iter()
        .map(|c| index(cf, c))
        .collect::<Result<Vec<_>, _>>()?;
    let decls = Declarations::of_conf(cf).ok_or(ConfFail::Logged)?;
    decls.entries.retain(|e| e.result != result);
    decls.entries.push(Entry {
        result,
        candidates,
        default: spec.default,
    });
    Ok(())
}

/// Value of a `dynamic_upstrand` result variable (`data` = its index).
struct DynamicVariable;

impl Variable for DynamicVariable {
    fn get(r: Req, v: &mut VarSlot, data: usize) -> Status {
        let Some(entry) =
            Declarations::of_request(r).and_then(|d| d.entries.iter().find(|e| e.result == data))
        else {
            v.not_found();
            return Status::NGX_OK;
        };
        let values: Vec<Option<Vec<u8>>> =
            entry.candidates.iter().map(|i| r.variable(*i)).collect();
        let chosen = choose(
            values.iter().map(|o| o.as_deref()),
            entry.default.as_deref(),
        );
        match chosen.and_then(|name| Registry::of_request(r).and_then(|reg| reg.find(&name))) {
            Some(up) => upstrand_value(r, v, up),
            None => {
                // Empty value: `proxy_pass http://$RESULT` then fails with 500.
                v.set_static(b"");
                Status::NGX_OK
            }
        }
    }
}

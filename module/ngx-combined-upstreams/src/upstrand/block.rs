//! The `upstrand NAME { ... }` block directive.

use core::cell::RefCell;

use ngx::ffi::{
    ngx_command_t, ngx_conf_t, NGX_CONF_BLOCK, NGX_CONF_TAKE1, NGX_HTTP_MAIN_CONF,
    NGX_HTTP_MAIN_CONF_OFFSET,
};
use upstrand_core::upstrand::conf::{check_unique, Matcher, UpstrandBuilder};
use upstrand_core::upstreams::addressable;
use upstrand_core::ConfError;

use super::{vars, Registry, Upstrand};
use crate::ffi::conf::{parse_block, Block, ConfExt, ConfPart, Directive, Regex};
use crate::ffi::upstream::{self as upstreams, Upstream};
use crate::ffi::{command, ConfFail};

/// Directive table entry: `upstrand NAME { ... }` (http).
pub const COMMAND: ngx_command_t = command::<Handler>(
    c"upstrand",
    NGX_HTTP_MAIN_CONF | NGX_CONF_BLOCK | NGX_CONF_TAKE1,
    NGX_HTTP_MAIN_CONF_OFFSET,
);

/// Upstreams of the configuration so far that `proxy_pass http://NAME` can address by name
/// (explicit `upstream` blocks and upstreams created like them: port 0), in definition order.
pub(super) fn named_upstreams(cf: &ngx_conf_t) -> Vec<Upstream> {
    let list = upstreams::all(cf);
    addressable(&upstreams::infos(&list))
        .into_iter()
        .map(|i| list[i])
        .collect()
}

/// Compiles `pattern` with nginx's regex engine (PCRE), case-sensitive, unanchored. The matcher
/// is used while the `upstream ~REGEX` directive is handled (the regex lives in the
/// configuration pool).
fn compile(cf: &ngx_conf_t, pattern: &str) -> Result<Matcher, String> {
    let re = Regex::compile(cf, pattern)?;
    Ok(Box::new(move |name: &str| re.is_match(name)))
}

fn text(arg: &[u8]) -> Result<&str, ConfError> {
    core::str::from_utf8(arg)
        .map_err(|_| ConfError::InvalidParameter(String::from_utf8_lossy(arg).into_owned()))
}

/// The directives inside the block.
struct Inner;

impl Block for Inner {
    type State = UpstrandBuilder;

    fn directive(cf: &ngx_conf_t, builder: &mut UpstrandBuilder) -> Result<(), ConfFail> {
        inner_directive(cf, builder)
    }
}

/// One directive inside the block, added to `builder`.
fn inner_directive(cf: &ngx_conf_t, builder: &mut UpstrandBuilder) -> Result<(), ConfFail> {
    let raw = cf.args();
    let args = raw.iter().map(|a| text(a)).collect::<Result<Vec<_>, _>>()?;
    let known: Vec<String> = named_upstreams(cf)
        .into_iter()
        .map(|u| String::from_utf8_lossy(u.host()).into_owned())
        .collect();
    let known: Vec<&str> = known.iter().map(String::as_str).collect();
    let mut compile_fn = |p: &str| compile(cf, p);
    Ok(builder.directive(&args, &known, &mut compile_fn)?)
}

/// `upstrand NAME { ... }`
struct Handler;

impl Directive for Handler {
    fn handle(cf: &mut ngx_conf_t) -> Result<(), ConfFail> {
        block(cf)
    }
}

/// Parses the block and registers the upstrand (and its `$upstrand_NAME`) in the
/// configuration's registry.
fn block(cf: &mut ngx_conf_t) -> Result<(), ConfFail> {
    // NGX_CONF_TAKE1 guarantees the name argument.
    let arg = cf.args().get(1).copied().unwrap_or_default();
    let name = String::from_utf8_lossy(arg);
    // Checks the name (letters, digits, `_`; not a status variable's suffix) first.
    let mut builder = UpstrandBuilder::new(&name)?;
    let reg = Registry::of_conf(cf).ok_or(ConfFail::Logged)?;
    check_unique(reg.upstrands.iter().map(|u| u.conf.name.as_str()), &name)?;
    // The nested parse: each directive of the block goes to `Inner` with the builder.
    parse_block::<Inner>(cf, &mut builder)?;
    let conf = builder.finish()?;
    if !vars::register_upstrand(cf, &conf.name, reg.upstrands.len()) {
        return Err(ConfFail::Logged);
    }
    reg.upstrands.push(Upstrand {
        conf,
        state: RefCell::new(None),
    });
    Ok(())
}
